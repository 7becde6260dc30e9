package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/pgcluster"
)

// pgSettings are the settings of every PostgreSQL server of a run.
//
// fsync is off (Options.Durable false): the run kills processes, never the
// machine, whose page cache keeps what a killed server wrote. Commits still
// wait for their WAL write and for the synchronous standby to flush it, or
// a restart in immediate mode or a failover would lose acknowledged
// transactions and the run would blame Baton.
var pgSettings = map[string]string{
	"synchronous_commit": "on",
	// A standby whose primary restarted connects again after this long,
	// and every commit on the primary waits for it meanwhile: one second
	// instead of five keeps the restarts short.
	"wal_retrieve_retry_interval": "1s",
	// A process cut off from the server keeps its sessions open on the
	// server, and a worker its session's lock, until the server finds the
	// connection dead: TCP keepalives bound that to about 5+3x2 s of
	// silence (the kernel's default is two hours), after which the other
	// workers take its turns over at once instead of after the lease.
	// The same as deploy/postgres/baton.conf, with tcp_user_timeout for a
	// connection whose last reply was never acknowledged.
	"tcp_keepalives_idle":              "5",
	"tcp_keepalives_interval":          "2",
	"tcp_keepalives_count":             "3",
	"tcp_user_timeout":                 "11s",
	"client_connection_check_interval": "2s",
}

// startPostgresPair starts the primary (pg1) and makes its synchronous
// standby (pg2) with pg_basebackup, on two ports that the run's database
// URL names for good.
func (s *system) startPostgresPair(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	s.pgPorts = ports
	name := s.nextPGName()
	settings := maps.Clone(pgSettings)
	// The processes reach the servers from their namespaces, through the
	// harness's link to the run's network.
	settings["listen_addresses"] = "127.0.0.1," + s.net.HostIP()
	pg, err := pgcluster.New(pgcluster.Options{
		Dir:      filepath.Join(s.dir, name),
		Port:     ports[0],
		LogFile:  filepath.Join(s.logs, name+".log"),
		Durable:  false,
		Settings: settings,
		HBA:      []string{"host all postgres " + s.net.CIDR() + " trust"},
	})
	if err != nil {
		return err
	}
	if err := pg.Init(ctx); err != nil {
		return err
	}
	if err := pg.Start(ctx); err != nil {
		return err
	}
	s.pg, s.pgName = pg, name
	return s.makeStandby(ctx, ports[1])
}

func (s *system) nextPGName() string {
	s.pgNodes++
	return fmt.Sprintf("pg%d", s.pgNodes)
}

// makeStandby makes a new synchronous standby of the primary on port, in a
// new data folder, and returns once the primary's commits wait for it.
func (s *system) makeStandby(ctx context.Context, port int) error {
	name := s.nextPGName()
	sb, err := s.pg.Standby(ctx, pgcluster.StandbyOptions{
		Dir:         filepath.Join(s.dir, name),
		Port:        port,
		Name:        name,
		Synchronous: true,
		LogFile:     filepath.Join(s.logs, name+".log"),
	})
	if err != nil {
		return fmt.Errorf("make standby %s of %s: %w", name, s.pgName, err)
	}
	s.standby, s.standbyName = sb, name
	return nil
}

// restartPrimary starts the primary again on its port, retrying while the
// old server's port is still held.
func (s *system) restartPrimary(ctx context.Context) error {
	// A server stopped in immediate mode can leave backends behind for a
	// moment, holding the port or the shared memory.
	var err error
	for range 60 {
		if err = s.pg.Start(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return err
}

// failover kills the primary with SIGKILL (every one of its processes, as
// when its machine is lost) and promotes the synchronous standby. The old
// primary never comes back: a new synchronous standby is made from the new
// primary with pg_basebackup, in a new folder, on the dead primary's port,
// so the URL every process was started with names both servers again and
// the next Postgres fault has its targets.
//
// With behind, the primary's WAL sender to the standby is stopped for one
// to two seconds first: the commits made meanwhile are flushed on the
// primary, where the relay may decode and publish them, but wait for the
// standby, so none is acknowledged; they die with the primary. The note
// says how many waited and whether the promoted standby hands out outbox
// ids that the old primary had handed out already.
func (in *injector) failover(ctx context.Context, r *faultRecord, behind bool) {
	s := in.sys
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	old, oldName, sb, sbName := s.pg, s.pgName, s.standby, s.standbyName
	r.target = oldName
	if sb == nil {
		r.at = time.Now()
		r.failed = true
		r.note = "no standby to promote (making one failed before)"
		return
	}
	var lastID int64 = -1
	if behind {
		held, id, err := s.holdBackStandby(ctx, time.Duration(1000+in.rng.IntN(1000))*time.Millisecond)
		if err != nil {
			r.failed = true
			r.note = "COULD NOT HOLD THE STANDBY BACK: " + firstLine(err.Error()) + "; "
		} else {
			r.note = held + "; "
			lastID = id
		}
	}
	if err := old.Stop(pgcluster.Kill); err != nil {
		r.note += "kill: " + firstLine(err.Error()) + "; "
	}
	r.at = time.Now()
	pctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	// Read before the promotion, while nobody can take an id there yet.
	var next int64
	var nextErr error
	if lastID >= 0 {
		next, nextErr = standbyLastOutboxID(pctx, sb)
	}
	if err := sb.Promote(pctx); err != nil {
		r.failed = true
		r.note += fmt.Sprintf("%s killed; PROMOTE OF %s FAILED: %s", oldName, sbName, firstLine(err.Error()))
		return
	}
	promoted := time.Since(r.at)
	s.pg, s.pgName, s.standby, s.standbyName = sb, sbName, nil, ""
	r.note += fmt.Sprintf("%s killed, %s promoted in %s", oldName, sbName, promoted.Round(time.Millisecond))
	if lastID >= 0 {
		switch {
		case nextErr != nil:
			r.note += "; the standby's outbox id sequence not read: " + firstLine(nextErr.Error())
		case next < lastID:
			r.note += fmt.Sprintf("; outbox ids %d..%d (at least) go out again", next+1, lastID)
		default:
			r.note += fmt.Sprintf("; no outbox id goes out again (next %d)", next+1)
		}
	}

	began := time.Now()
	if err := waitPortFree(ctx, old.Port(), 10*time.Second); err != nil {
		r.failed = true
		r.note += "; NO NEW STANDBY: " + err.Error()
		return
	}
	if err := s.makeStandby(ctx, old.Port()); err != nil {
		r.failed = true
		r.note += "; NO NEW STANDBY: " + firstLine(err.Error())
		return
	}
	r.note += fmt.Sprintf("; new synchronous standby %s in %s", s.standbyName, time.Since(began).Round(time.Millisecond))
}

// holdBackStandby stops (SIGSTOP) the primary's WAL sender to the standby
// for d, and reads, before it returns with the sender still stopped, how
// many commits wait for the standby, how much WAL it has not been sent,
// and the last outbox id handed out on the primary.
func (s *system) holdBackStandby(ctx context.Context, d time.Duration) (string, int64, error) {
	conn, err := pgx.Connect(ctx, s.pg.URL("baton"))
	if err != nil {
		return "", 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pid FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
		s.standbyName).Scan(&pid); err != nil {
		return "", 0, fmt.Errorf("find the WAL sender to %s: %w", s.standbyName, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return "", 0, fmt.Errorf("stop the WAL sender (pid %d): %w", pid, err)
	}
	// The kernel stops the process when it next runs, not within kill(2).
	deadline := time.Now().Add(10 * time.Second)
	for !processStopped(pid) {
		if time.Now().After(deadline) {
			return "", 0, fmt.Errorf("the WAL sender (pid %d) did not stop within 10s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-ctx.Done():
		return "", 0, ctx.Err()
	case <-time.After(d):
	}
	var waiting int
	var unsent, lastID int64
	if err := conn.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'),
			coalesce((SELECT pg_current_wal_lsn() - sent_lsn FROM pg_stat_replication WHERE pid = $1), 0)::bigint,
			(SELECT last_value FROM agent_outbox_id_seq)`, pid).Scan(&waiting, &unsent, &lastID); err != nil {
		return "", 0, err
	}
	return fmt.Sprintf("WAL sender to %s stopped %s: %d commits waiting, %d bytes of WAL unsent, outbox ids handed out up to %d",
		s.standbyName, d.Round(time.Millisecond), waiting, unsent, lastID), lastID, nil
}

// standbyLastOutboxID reads, on a standby whose primary is gone, the last
// outbox id its sequence logged once it has replayed all the WAL it
// received: a promotion hands out ids after it.
func standbyLastOutboxID(ctx context.Context, sb *pgcluster.Cluster) (int64, error) {
	conn, err := pgx.Connect(ctx, sb.URL("baton"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var replayed bool
		if err := conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), false)`).Scan(&replayed); err != nil {
			return 0, err
		}
		if replayed {
			break
		}
		if time.Now().After(deadline) {
			return 0, errors.New("the standby did not replay what it received within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var id int64
	err = conn.QueryRow(ctx, `SELECT last_value FROM agent_outbox_id_seq`).Scan(&id)
	return id, err
}

// processStopped reports whether pid is stopped by a signal, from
// /proc/<pid>/stat.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && fields[0] == "T"
}

// waitPortFree polls until nothing listens on port any more.
func waitPortFree(ctx context.Context, port int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for !pgcluster.PortFree(port) {
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d still busy after %s", port, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// pauseStandby stops the synchronous standby's WAL receiver (SIGSTOP) for
// two to five seconds while the load runs, then resumes it: meanwhile every
// commit on the primary waits. It counts the sessions seen waiting
// (wait_event SyncRep), and fails the fault when none did, which would
// mean that the standby was not synchronous.
func (in *injector) pauseStandby(ctx context.Context, r *faultRecord) {
	s := in.sys
	s.pgMu.Lock()
	defer s.pgMu.Unlock()
	sb := s.standby
	r.target = s.standbyName
	if sb == nil {
		r.at = time.Now()
		r.failed = true
		r.note = "no standby to pause (making one failed before)"
		return
	}
	conn, err := pgx.Connect(ctx, s.pg.URL("postgres"))
	if err != nil {
		r.at = time.Now()
		r.failed = true
		r.note = "connect to the primary: " + firstLine(err.Error())
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Sessions waiting for the standby, and the longest wait so far.
	waiting := func() (int, time.Duration, error) {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var n int
		var longest float64
		err := conn.QueryRow(qctx, `
			SELECT count(*), coalesce(extract(epoch FROM max(clock_timestamp() - query_start)), 0)::float8
			FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n, &longest)
		return n, time.Duration(longest * float64(time.Second)), err
	}

	pause := time.Duration(2000+in.rng.IntN(3000)) * time.Millisecond
	if err := sb.PauseWALReceiver(ctx); err != nil {
		r.at = time.Now()
		r.failed = true
		r.note = "PAUSE FAILED: " + firstLine(err.Error())
		return
	}
	r.at = time.Now()
	most, longest := 0, time.Duration(0)
	for end := r.at.Add(pause); time.Now().Before(end) && ctx.Err() == nil; {
		if n, d, err := waiting(); err == nil {
			most, longest = max(most, n), max(longest, d)
		}
		in.sleep(ctx, min(200*time.Millisecond, time.Until(end)))
	}
	stopped := time.Since(r.at)
	if err := sb.ResumeWALReceiver(); err != nil {
		r.failed = true
		r.note = "RESUME FAILED: " + firstLine(err.Error())
		return
	}
	resumed := time.Now()
	left := -1
	for time.Since(resumed) < 30*time.Second && ctx.Err() == nil {
		// Commits wait for the standby a moment each in any case: what
		// counts is that none waits since before the resume.
		if n, d, err := waiting(); err == nil {
			if left = n; n == 0 || d < time.Since(resumed) {
				left = 0
				break
			}
		}
		in.sleep(ctx, 50*time.Millisecond)
	}
	r.note = fmt.Sprintf("WAL receiver stopped for %s: up to %d commits waited, the longest %s",
		stopped.Round(time.Millisecond), most, longest.Round(time.Millisecond))
	switch {
	case longest < time.Second:
		// A commit waits a moment for the standby in any case; a pause of
		// two seconds or more must hold one up for a second at least.
		r.failed = true
		r.note += "; NO COMMIT HELD UP: is the standby synchronous?"
	case left < 0:
		r.failed = true
		r.note += "; could not read the primary's sessions after the resume"
	case left != 0:
		r.failed = true
		r.note += fmt.Sprintf("; %d commits STILL WAITING since before the resume 30s later", left)
	default:
		r.note += fmt.Sprintf("; none held up %s after the resume", time.Since(resumed).Round(time.Millisecond))
	}
}
