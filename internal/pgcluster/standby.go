package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configure a standby made by Cluster.Standby.
type StandbyOptions struct {
	// Dir is the standby's data directory. It must not exist yet, or be
	// empty. Defaults to the primary's data directory followed by "-" and
	// Name, beside it.
	Dir string
	// Port is the standby's TCP port on 127.0.0.1. Defaults to a free
	// port.
	Port int
	// Name is the standby's application_name on the primary (as seen in
	// pg_stat_replication and named in synchronous_standby_names) and the
	// name of its physical replication slot there, which keeps the WAL the
	// standby has not received yet. One to 63 lower-case letters, digits
	// and underscores. Defaults to "standby_<port>".
	Name string
	// Synchronous adds the standby to the primary's synchronous standbys
	// (see SetSynchronousStandbys): from the moment Standby returns, no
	// commit on the primary returns before this standby has flushed its
	// WAL, so an acknowledged commit survives a failover to it. Defaults to
	// false: the standby streams asynchronously.
	Synchronous bool
	// LogFile receives the standby's server log. Defaults to
	// <Dir>/postgres.log.
	LogFile string
}

var validSlotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Standby makes a streaming standby of the running cluster c with
// pg_basebackup, starts it and returns once the primary sees it streaming
// (and, with StandbyOptions.Synchronous, waits for it on every commit).
// The standby has c's options (durability, settings, TLS, pg_hba lines)
// and its own data directory, port and log. It is a hot standby: it takes
// read-only connections. Stopping c with Stop resumes the standby's WAL
// receiver if it is paused.
func (c *Cluster) Standby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	if !c.Running() {
		return nil, fmt.Errorf("pgcluster: make a standby of the cluster on port %d: it is not running", c.opts.Port)
	}
	if opts.Synchronous {
		if err := c.canSetSynchronousStandbys(true); err != nil {
			return nil, fmt.Errorf("pgcluster: StandbyOptions.Synchronous: %w", err)
		}
	}
	if opts.Port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		opts.Port = p
	}
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("standby_%d", opts.Port)
	}
	if !validSlotName.MatchString(opts.Name) {
		return nil, fmt.Errorf("pgcluster: StandbyOptions.Name %q: use 1 to 63 lower-case letters, digits and underscores (it names a replication slot)", opts.Name)
	}
	if opts.Dir == "" {
		opts.Dir = c.opts.Dir + "-" + opts.Name
	}
	settings := make(map[string]string, len(c.opts.Settings))
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	s, err := New(Options{
		Dir:      opts.Dir,
		Port:     opts.Port,
		Durable:  c.opts.Durable,
		Settings: settings,
		LogFile:  opts.LogFile,
		TLS:      c.opts.TLS,
		HBA:      c.opts.HBA,
	})
	if err != nil {
		return nil, err
	}
	s.name = opts.Name
	if s.Initialized() {
		return nil, fmt.Errorf("pgcluster: StandbyOptions.Dir %s already holds a cluster: give an empty or new folder", s.opts.Dir)
	}
	if err := s.baseBackup(ctx, c); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.standbys = append(c.standbys, s)
	c.mu.Unlock()
	syncBefore := c.synchronousStandbys()
	fail := func(err error) (*Cluster, error) {
		_ = s.Stop(Immediate)
		cctx := context.WithoutCancel(ctx)
		if opts.Synchronous {
			// Commits would wait for a standby that never comes.
			_ = c.SetSynchronousStandbys(cctx, syncBefore...)
		}
		// The slot would keep WAL for it.
		_ = c.withConn(cctx, func(conn *pgx.Conn) error {
			_, err := conn.Exec(cctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, s.name)
			return err
		})
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return fail(fmt.Errorf("pgcluster: start standby %s: %w", s.name, err))
	}
	if err := c.waitStreaming(ctx, s, false); err != nil {
		return fail(err)
	}
	if opts.Synchronous {
		if err := c.SetSynchronousStandbys(ctx, append(syncBefore, s.name)...); err != nil {
			return fail(err)
		}
		if err := c.waitStreaming(ctx, s, true); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// Name returns the application_name of a standby made by Standby, which
// stays its name after a promotion, and "" for any other cluster.
func (c *Cluster) Name() string { return c.name }

// baseBackup copies primary into c's data directory and configures it to
// follow primary through its own replication slot.
func (c *Cluster) baseBackup(ctx context.Context, primary *Cluster) error {
	if err := os.MkdirAll(c.opts.Dir, 0o700); err != nil {
		return err
	}
	if err := c.chown(c.opts.Dir); err != nil {
		return err
	}
	// The harness's own way in: the superuser, without TLS, which Options.HBA
	// always admits. pg_basebackup -R writes these parameters into the
	// standby's primary_conninfo.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres sslmode=disable application_name=%s", primary.Port(), c.name)
	args := []string{"-D", c.opts.Dir, "-d", conninfo, "-X", "stream", "-c", "fast", "-R", "-C", "-S", c.name}
	if !c.opts.Durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "pg_basebackup"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = os.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: pg_basebackup from port %d into %s: %w\n%s", primary.Port(), c.opts.Dir, err, out)
	}
	// A primary's log inside its data directory was copied too: the
	// standby's log must start empty, or its tail would tell the primary's
	// story.
	if rel, err := filepath.Rel(primary.opts.Dir, primary.opts.LogFile); err == nil && !strings.HasPrefix(rel, "..") {
		if err := os.Remove(filepath.Join(c.opts.Dir, rel)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// The primary's synchronous standbys are no business of the standby:
	// once promoted, it would wait for them (itself among them) forever.
	return c.dropAutoSettings("synchronous_standby_names", "synchronous_commit")
}

// dropAutoSettings removes the named settings from postgresql.auto.conf,
// the file ALTER SYSTEM writes and pg_basebackup copies.
func (c *Cluster) dropAutoSettings(names ...string) error {
	path := filepath.Join(c.opts.Dir, "postgresql.auto.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var kept []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		key, _, _ := strings.Cut(strings.TrimSpace(line), "=")
		drop := false
		for _, n := range names {
			if strings.TrimSpace(key) == n {
				drop = true
			}
		}
		if !drop {
			kept = append(kept, line)
		}
	}
	return c.writeFile(path, []byte(strings.Join(kept, "")), 0o600)
}

// waitStreaming waits until the primary c reports standby s streaming, and
// with sync also as a synchronous standby.
func (c *Cluster) waitStreaming(ctx context.Context, s *Cluster, sync bool) error {
	what := fmt.Sprintf("pgcluster: wait for standby %s to stream from port %d", s.name, c.opts.Port)
	if sync {
		what = fmt.Sprintf("pgcluster: wait for the primary on port %d to treat standby %s as synchronous", c.opts.Port, s.name)
	}
	return s.waitUntil(ctx, waitTimeout, what, func(ctx context.Context) (bool, error) {
		var state, syncState string
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`, s.name).Scan(&state, &syncState)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return state == "streaming" && (!sync || syncState == "sync"), nil
	})
}

// canSetSynchronousStandbys says why ALTER SYSTEM cannot set c's
// synchronous standbys (wait: to a non-empty list), if it cannot.
func (c *Cluster) canSetSynchronousStandbys(wait bool) error {
	if _, ok := c.opts.Settings["synchronous_standby_names"]; ok {
		return errors.New("the primary's Options.Settings sets synchronous_standby_names on its command line, where ALTER SYSTEM cannot change it: leave it out of Settings")
	}
	if v, ok := c.opts.Settings["synchronous_commit"]; ok && wait && (v == "off" || v == "local") {
		return fmt.Errorf("the primary's Options.Settings sets synchronous_commit=%s on its command line, where ALTER SYSTEM cannot turn it on: leave it out of Settings", v)
	}
	return nil
}

func (c *Cluster) synchronousStandbys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.syncNames...)
}

// SetSynchronousStandbys makes every commit on the primary c wait until
// each named standby (by application_name, see Cluster.Name) has flushed
// the commit's WAL, replacing the list set before; with no names, commits
// stop waiting, which releases those that wait already. It turns
// synchronous_commit on while there are names, whatever Options.Durable
// says, and returns once the server applies the change.
func (c *Cluster) SetSynchronousStandbys(ctx context.Context, names ...string) error {
	if err := c.canSetSynchronousStandbys(len(names) > 0); err != nil {
		return fmt.Errorf("pgcluster: SetSynchronousStandbys: %w", err)
	}
	value := ""
	stmts := []string{
		`ALTER SYSTEM RESET synchronous_standby_names`,
		`ALTER SYSTEM RESET synchronous_commit`,
	}
	if len(names) > 0 {
		quoted := make([]string, len(names))
		for i, n := range names {
			if n == "" {
				return errors.New("pgcluster: SetSynchronousStandbys: a standby name is empty")
			}
			quoted[i] = `"` + strings.ReplaceAll(n, `"`, `""`) + `"`
		}
		// FIRST n of n names: every one of them must confirm.
		value = fmt.Sprintf("FIRST %d (%s)", len(names), strings.Join(quoted, ", "))
		stmts = []string{
			`ALTER SYSTEM SET synchronous_standby_names = ` + quoteLiteral(value),
			`ALTER SYSTEM SET synchronous_commit = on`,
		}
	}
	stmts = append(stmts, `SELECT pg_reload_conf()`)
	err := c.withConn(ctx, func(conn *pgx.Conn) error {
		for _, q := range stmts {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgcluster: set the synchronous standbys of port %d: %w", c.opts.Port, err)
	}
	// A new session sees the reloaded file once the postmaster has read it,
	// and the postmaster signals the checkpointer before it forks again.
	err = c.waitUntil(ctx, waitTimeout, "pgcluster: wait for the server to reload synchronous_standby_names", func(ctx context.Context) (bool, error) {
		var got string
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&got)
		})
		return got == value, err
	})
	if err != nil {
		return err
	}
	// Commits consult the checkpointer's copy of the setting in shared
	// memory, which it updates when it handles the reload signal. It
	// handles pending signals before it takes a checkpoint request, so once
	// a checkpoint completes, commits wait (or stop waiting) as told.
	err = c.withConn(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `CHECKPOINT`)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgcluster: checkpoint after setting the synchronous standbys of port %d: %w", c.opts.Port, err)
	}
	c.mu.Lock()
	c.syncNames = append([]string(nil), names...)
	c.mu.Unlock()
	return nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// WaitCaughtUp waits until standby has replayed all the WAL that the
// primary c had inserted when WaitCaughtUp was called, commits made with
// synchronous_commit off included: what was committed on c before the call
// is then visible on standby.
func (c *Cluster) WaitCaughtUp(ctx context.Context, standby *Cluster) error {
	var target string
	err := c.withConn(ctx, func(conn *pgx.Conn) error {
		// The insert position is where the next record starts; at the start
		// of a page that is past the page header, where no replayed record
		// ends: step back over the header (a long one opens each segment).
		return conn.QueryRow(ctx, `
			SELECT (CASE
				WHEN (lsn - '0/0') % seg.setting::numeric = 40 THEN lsn - 40
				WHEN (lsn - '0/0') % blk.setting::numeric = 24 THEN lsn - 24
				ELSE lsn END)::text
			FROM pg_current_wal_insert_lsn() AS lsn,
				pg_settings seg, pg_settings blk
			WHERE seg.name = 'wal_segment_size' AND blk.name = 'wal_block_size'`).Scan(&target)
	})
	if err != nil {
		return fmt.Errorf("pgcluster: read the WAL position of port %d: %w", c.opts.Port, err)
	}
	what := fmt.Sprintf("pgcluster: wait for the standby on port %d to replay the WAL of port %d up to %s", standby.opts.Port, c.opts.Port, target)
	return standby.waitUntil(ctx, waitTimeout, what, func(ctx context.Context) (bool, error) {
		var done bool
		err := standby.withConn(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, target).Scan(&done)
		})
		return done, err
	})
}

// InRecovery reports whether the server is a standby (in recovery) rather
// than a primary that takes writes.
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	var in bool
	err := c.withConn(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in)
	})
	if err != nil {
		return false, fmt.Errorf("pgcluster: ask port %d whether it is in recovery: %w", c.opts.Port, err)
	}
	return in, nil
}
