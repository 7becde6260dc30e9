// Package pgcluster creates and runs a private PostgreSQL cluster from the
// machine's server binaries. `baton dev` keeps one under ./.baton, and the
// tests start throwaway ones; both need logical replication turned on, which
// is why the cluster is configured here and not left to a system service.
// Failover and deployment tests also get streaming standbys (synchronous or
// not, with a WAL receiver they can pause), promotion, a hard kill,
// multi-host URLs, TLS and their own pg_hba.conf lines.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrBinariesNotFound is returned when no initdb/postgres pair can be found.
var ErrBinariesNotFound = errors.New("PostgreSQL server binaries (initdb, postgres) not found: " +
	"install Debian's postgresql package (apt-get install -y postgresql), " +
	"or point Baton at an existing server with BATON_DATABASE_URL")

// FindBinDir returns the folder that holds initdb and postgres: the PATH
// first, then Debian's versioned layout (/usr/lib/postgresql/<major>/bin),
// newest major first.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		return majorOf(matches[i]) > majorOf(matches[j])
	})
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	return "", ErrBinariesNotFound
}

func majorOf(initdbPath string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))))
	return n
}

// Options configure a cluster.
type Options struct {
	// Dir is the data directory. It is created by Init when missing.
	// Required: New refuses an empty Dir.
	Dir string
	// Port is the TCP port on 127.0.0.1. Defaults to a free port picked at
	// the first Start.
	Port int
	// Durable keeps fsync, synchronous_commit and full_page_writes on.
	// Tests turn them off for speed; `baton dev` keeps them on so that data
	// survives a machine crash too. Defaults to false.
	Durable bool
	// Settings are extra `-c name=value` server settings. They win over
	// everything else, ALTER SYSTEM included. Defaults to none.
	Settings map[string]string
	// LogFile receives the server's log. Defaults to <Dir>/postgres.log.
	LogFile string
	// TLS turns ssl on, with a server certificate for 127.0.0.1, ::1 and
	// localhost signed by a certificate authority made for this cluster
	// (see CAFile). The files are made at the first Start and kept in the
	// data directory, so the CA survives restarts and is copied to
	// standbys. Defaults to false: the server refuses TLS.
	TLS bool
	// HBA replaces pg_hba.conf at every Start with these lines, after two
	// that let the superuser postgres in from 127.0.0.1 without TLS and
	// without a password, for normal and replication connections (the
	// harness, standbys and URL connect that way). A connection that
	// matches no line is refused. For example
	// "hostssl all all 127.0.0.1/32 scram-sha-256" admits every role that
	// has a password, over TLS only. Defaults to nil: initdb's file, which
	// trusts every connection from this machine.
	HBA []string
}

// Cluster is one PostgreSQL server process over one data directory.
type Cluster struct {
	opts   Options
	binDir string
	cred   *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// name is a standby's application_name on its primary; empty on a
	// cluster that was never a standby.
	name string
	// standbys are the standbys made from this cluster, whose paused WAL
	// receivers Stop resumes.
	standbys []*Cluster
	// syncNames are the standbys this primary's commits wait for.
	syncNames []string
	// pausedPID is the WAL receiver stopped by PauseWALReceiver.
	pausedPID int
}

// New prepares a cluster; nothing runs until Start.
func New(opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgcluster: Options.Dir is empty: give the data directory")
	}
	abs, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = abs
	if opts.LogFile == "" {
		opts.LogFile = filepath.Join(opts.Dir, "postgres.log")
	}
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, binDir: binDir}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root; run it as the postgres user
		// that Debian's package creates.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs a 'postgres' user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return c, nil
}

// Dir returns the data directory.
func (c *Cluster) Dir() string { return c.opts.Dir }

// Port returns the TCP port.
func (c *Cluster) Port() int { return c.opts.Port }

// URL returns a connection URL for database db as the superuser "postgres".
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.opts.Port, db)
}

// Initialized reports whether the data directory holds a cluster.
func (c *Cluster) Initialized() bool {
	_, err := os.Stat(filepath.Join(c.opts.Dir, "PG_VERSION"))
	return err == nil
}

// Init runs initdb unless the directory already holds a cluster.
func (c *Cluster) Init(ctx context.Context) error {
	if c.Initialized() {
		return nil
	}
	if err := os.MkdirAll(c.opts.Dir, 0o700); err != nil {
		return err
	}
	if err := c.chown(c.opts.Dir); err != nil {
		return err
	}
	args := []string{"-D", c.opts.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"}
	if !c.opts.Durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = os.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", c.opts.Dir, err, out)
	}
	return nil
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// FreePort returns a TCP port free on 127.0.0.1 for a server to listen on.
// It picks one below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range) when it can: a port from that range, once
// released, may be taken at any moment as the local port of some outgoing
// connection, which would make a server that stops and starts again on it
// (a restart, a failover) find it busy. Otherwise it asks the kernel.
func FreePort() (int, error) {
	if low := ephemeralLow(); low > fixedPortsFrom+1000 {
		for range 50 {
			port := fixedPortsFrom + rand.IntN(low-fixedPortsFrom)
			if PortFree(port) {
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// fixedPortsFrom is the lowest port FreePort picks: above the well-known
// and most registered services' ports.
const fixedPortsFrom = 20000

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}

// PortFree reports whether port can be bound on 127.0.0.1.
func PortFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Start launches the server and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return errors.New("pgcluster: already running")
	}
	if c.opts.Port == 0 {
		p, err := FreePort()
		if err != nil {
			c.mu.Unlock()
			return err
		}
		c.opts.Port = p
	} else if !PortFree(c.opts.Port) {
		c.mu.Unlock()
		return fmt.Errorf("port %d on 127.0.0.1 is busy: choose another one for the local PostgreSQL", c.opts.Port)
	}
	settings := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"unix_socket_directories":   "",
		"wal_level":                 "logical",
		"max_wal_senders":           "40",
		"max_replication_slots":     "40",
		"max_connections":           "300",
		"wal_sender_timeout":        "60s",
		"shared_buffers":            "128MB",
		"log_min_messages":          "warning",
		"log_line_prefix":           "%m [%p] ",
		"logical_decoding_work_mem": "64MB",
	}
	if err := c.writeConfig(); err != nil {
		c.mu.Unlock()
		return err
	}
	if c.opts.TLS {
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = serverCertFile
		settings["ssl_key_file"] = serverKeyFile
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", c.opts.Dir, "-p", strconv.Itoa(c.opts.Port)}
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logf, err := os.OpenFile(c.opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), args...)
	// Its own process group: a Ctrl-C in the terminal reaches Baton, which
	// then stops PostgreSQL in order, instead of both racing.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = c.opts.Dir
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.mu.Unlock()
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	c.cmd, c.done = cmd, done
	go func() {
		_ = cmd.Wait()
		logf.Close()
		c.mu.Lock()
		if c.cmd == cmd {
			c.cmd = nil
		}
		c.mu.Unlock()
		close(done)
	}()
	c.mu.Unlock()
	return c.waitReady(ctx, done)
}

func (c *Cluster) waitReady(ctx context.Context, done chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited during start-up; %s", c.logTail())
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections on port %d: %w (log: %s)", c.opts.Port, err, c.opts.LogFile)
		case <-time.After(backoff):
		}
		if backoff < 200*time.Millisecond {
			backoff *= 2
		}
	}
}

// waitTimeout bounds every wait for the server to reach a state.
const waitTimeout = 60 * time.Second

// waitUntil polls cond until it holds, returning an error when c's server
// exits first (with its log tail) or timeout passes (with cond's last
// error).
func (c *Cluster) waitUntil(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c.mu.Lock()
	done, running := c.done, c.cmd != nil
	c.mu.Unlock()
	if !running {
		return fmt.Errorf("%s: postgres on port %d is not running; %s", what, c.opts.Port, c.logTail())
	}
	backoff := 5 * time.Millisecond
	for {
		ok, err := cond(ctx)
		if ok && err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s: postgres on port %d exited; %s", what, c.opts.Port, c.logTail())
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%s: not done within %s (%w): %w", what, timeout, ctx.Err(), err)
			}
			return fmt.Errorf("%s: not done within %s: %w", what, timeout, ctx.Err())
		case <-time.After(backoff):
		}
		if backoff < 100*time.Millisecond {
			backoff *= 2
		}
	}
}

// withConn runs f on a new connection to the "postgres" database as the
// superuser.
func (c *Cluster) withConn(ctx context.Context, f func(conn *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		if !c.Running() {
			return fmt.Errorf("connect to postgres on port %d: %w; the server is not running, %s", c.opts.Port, err, c.logTail())
		}
		return fmt.Errorf("connect to postgres on port %d: %w", c.opts.Port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

// logTail returns the last lines of the server's log, for errors about a
// server that failed or died.
func (c *Cluster) logTail() string {
	return fmt.Sprintf("its log %s ends:\n%s", c.opts.LogFile, tail(c.opts.LogFile, 20))
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StopMode says how the server shuts down (see "Shutting Down the Server"
// in the PostgreSQL manual).
type StopMode int

const (
	// Fast disconnects clients and shuts down cleanly (SIGINT).
	Fast StopMode = iota
	// Immediate quits without a shutdown checkpoint, like a crash: the next
	// start runs recovery (SIGQUIT).
	Immediate
	// Kill sends SIGKILL to the postmaster and every process below it at
	// once, like a machine that loses power: no backend outlives the
	// postmaster to finish a write or answer a client, and nothing restarts
	// the server until Start.
	Kill
)

// Stop shuts the server down in the given mode and waits for it to exit,
// after resuming any paused WAL receiver of c or of its standbys. It
// returns an error when the server did not exit on its own within 30
// seconds (it is then stopped the hard way).
func (c *Cluster) Stop(mode StopMode) error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	// A stopped WAL receiver handles no shutdown signal, and a primary's
	// shutdown waits for its standbys to receive the end of WAL: resume
	// every paused one, or the shutdown waits for the timeout below.
	c.resumeAll()
	sig := syscall.SIGINT
	switch mode {
	case Immediate:
		sig = syscall.SIGQUIT
	case Kill:
		sig = syscall.SIGKILL
	}
	var killed []int
	if mode == Kill {
		killed = killServer(cmd.Process.Pid)
	} else {
		_ = cmd.Process.Signal(sig)
	}
	var stuck error
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		// A shutdown that waits forever (for example on a replication
		// client that never confirms the end of WAL) is a bug worth
		// reporting; the server is then stopped the hard way.
		stuck = fmt.Errorf("postgres did not shut down within 30s of %s; it was killed", sig)
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			killed = killServer(cmd.Process.Pid)
			<-done
		}
	}
	// A child still exiting would keep the shared memory that the next
	// Start checks.
	if err := waitGone(killed, 10*time.Second); err != nil && stuck == nil {
		stuck = err
	}
	return stuck
}

// Restart stops the server in the given mode and starts it again on the
// same port.
func (c *Cluster) Restart(ctx context.Context, mode StopMode) error {
	if err := c.Stop(mode); err != nil {
		return err
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = c.Start(ctx); err == nil || !strings.Contains(err.Error(), "busy") {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Running reports whether the server process is alive.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd != nil
}

// ServerUser returns the uid and gid the server runs as when Baton runs as
// root (the postgres user), and ok=false otherwise.
func ServerUser() (uid, gid int, ok bool) {
	if os.Geteuid() != 0 {
		return 0, 0, false
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, false
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, true
}

// Reachable reports whether a process running as uid/gid can traverse
// every folder above dir, which the server needs to reach its data
// directory. A checkout under /root, for example, is not reachable by the
// postgres user.
func Reachable(dir string, uid, gid int) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		mode := fi.Mode().Perm()
		var x os.FileMode
		switch {
		case int(st.Uid) == uid:
			x = 0o100
		case int(st.Gid) == gid:
			x = 0o010
		default:
			x = 0o001
		}
		if mode&x == 0 {
			return false
		}
		if p == "/" {
			return true
		}
	}
}
