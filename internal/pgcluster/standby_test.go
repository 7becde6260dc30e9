package pgcluster_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
)

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, "connect to %s", url)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func exec(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	_, err := conn.Exec(ctx, sql, args...)
	require.NoError(t, err, sql)
}

func TestStandbyStreamsWhatThePrimaryCommitsAndRefusesWrites(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{})
	standby := newStandby(t, primary, pgcluster.StandbyOptions{Name: "replica_a"})
	require.Equal(t, "replica_a", standby.Name())
	require.NotEqual(t, primary.Port(), standby.Port())

	p := connect(t, ctx, primary.URL("postgres"))
	var state, syncState, slot string
	require.NoError(t, p.QueryRow(ctx, `SELECT r.state, r.sync_state, s.slot_name FROM pg_stat_replication r
		JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE r.application_name = 'replica_a'`).Scan(&state, &syncState, &slot))
	require.Equal(t, "streaming", state)
	require.Equal(t, "async", syncState, "a standby is asynchronous unless asked")
	require.Equal(t, "replica_a", slot, "the standby streams through its own slot")

	// Asynchronous commits (the default of a non-durable cluster) too.
	exec(t, ctx, p, `CREATE TABLE notes (id int PRIMARY KEY)`)
	exec(t, ctx, p, `INSERT INTO notes SELECT generate_series(1, 100)`)
	require.NoError(t, primary.WaitCaughtUp(ctx, standby))

	in, err := standby.InRecovery(ctx)
	require.NoError(t, err)
	require.True(t, in, "the standby is in recovery")
	in, err = primary.InRecovery(ctx)
	require.NoError(t, err)
	require.False(t, in)

	s := connect(t, ctx, standby.URL("postgres"))
	var n int
	require.NoError(t, s.QueryRow(ctx, `SELECT count(*) FROM notes`).Scan(&n))
	require.Equal(t, 100, n, "the standby has replayed every committed row")
	_, err = s.Exec(ctx, `INSERT INTO notes VALUES (101)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a write on the standby fails")
	require.Equal(t, "25006", pgErr.Code, "read_only_sql_transaction")

	// The primary's log sits in its data directory, which pg_basebackup
	// copies: the standby's log must still be its own.
	second := newStandby(t, primary, pgcluster.StandbyOptions{})
	require.Equal(t, "standby_"+strconv.Itoa(second.Port()), second.Name())
	log, err := os.ReadFile(filepath.Join(second.Dir(), "postgres.log"))
	require.NoError(t, err)
	require.NotContains(t, string(log), "["+strconv.Itoa(primaryPID(t, primary))+"]", "the standby's log holds none of the primary's lines")
}

// primaryPID is the postmaster's pid, from the first line of postmaster.pid.
func primaryPID(t *testing.T, c *pgcluster.Cluster) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.Dir(), "postmaster.pid"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	require.NoError(t, err)
	return pid
}

// commitAsync runs an INSERT on conn in the background and returns its
// backend pid and the channel its result arrives on.
func commitAsync(t *testing.T, ctx context.Context, conn *pgx.Conn, id int) (int, <-chan error) {
	t.Helper()
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, `INSERT INTO notes VALUES ($1)`, id)
		done <- err
	}()
	return pid, done
}

// waitSyncRep waits until backend pid of the primary waits for a
// synchronous standby to confirm its commit.
func waitSyncRep(t *testing.T, ctx context.Context, primary *pgcluster.Cluster, pid int) {
	t.Helper()
	admin := connect(t, ctx, primary.URL("postgres"))
	require.Eventually(t, func() bool {
		var ev string
		_ = admin.QueryRow(ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev)
		return ev == "SyncRep"
	}, 30*time.Second, 5*time.Millisecond, "backend %d waits for the synchronous standby (wait_event SyncRep)", pid)
}

func TestSynchronousCommitWaitsWhileTheStandbysReceiverIsPaused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{})
	standby := newStandby(t, primary, pgcluster.StandbyOptions{Synchronous: true})

	p := connect(t, ctx, primary.URL("postgres"))
	var syncCommit, names string
	require.NoError(t, p.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')`).Scan(&syncCommit, &names))
	require.Equal(t, "on", syncCommit, "a synchronous standby turns synchronous_commit back on in a non-durable cluster")
	require.Contains(t, names, standby.Name())
	var syncState string
	require.NoError(t, p.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standby.Name()).Scan(&syncState))
	require.Equal(t, "sync", syncState)
	exec(t, ctx, p, `CREATE TABLE notes (id int PRIMARY KEY)`)

	require.NoError(t, standby.PauseWALReceiver(ctx))
	require.Error(t, standby.PauseWALReceiver(ctx), "a second pause is refused")
	pid, done := commitAsync(t, ctx, p, 1)
	waitSyncRep(t, ctx, primary, pid)
	select {
	case err := <-done:
		t.Fatalf("the commit returned (%v) while the synchronous standby was paused", err)
	default:
	}
	require.NoError(t, standby.ResumeWALReceiver())
	select {
	case err := <-done:
		require.NoError(t, err, "the commit completes once the standby resumes")
	case <-time.After(30 * time.Second):
		t.Fatal("the commit still waits 30s after the standby resumed")
	}
	s := connect(t, ctx, standby.URL("postgres"))
	require.Eventually(t, func() bool {
		var n int
		_ = s.QueryRow(ctx, `SELECT count(*) FROM notes WHERE id = 1`).Scan(&n)
		return n == 1
	}, 30*time.Second, 5*time.Millisecond, "the standby replays the commit")

	// With no synchronous standby left, a commit no longer waits for a
	// paused one.
	require.NoError(t, primary.SetSynchronousStandbys(ctx))
	require.NoError(t, p.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&syncCommit))
	require.Equal(t, "off", syncCommit, "the non-durable default is back")
	require.NoError(t, standby.PauseWALReceiver(ctx))
	_, done = commitAsync(t, ctx, p, 2)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("an asynchronous commit waited 30s for a paused standby")
	}
}

func TestSetSynchronousStandbysReleasesWaitingCommits(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{})
	standby := newStandby(t, primary, pgcluster.StandbyOptions{Synchronous: true})
	p := connect(t, ctx, primary.URL("postgres"))
	exec(t, ctx, p, `CREATE TABLE notes (id int PRIMARY KEY)`)

	require.NoError(t, standby.Stop(pgcluster.Kill))
	pid, done := commitAsync(t, ctx, p, 1)
	waitSyncRep(t, ctx, primary, pid)
	require.NoError(t, primary.SetSynchronousStandbys(ctx))
	select {
	case err := <-done:
		require.NoError(t, err, "the commit that waited for a dead standby completes")
	case <-time.After(30 * time.Second):
		t.Fatal("the commit still waits 30s after the synchronous standbys were cleared")
	}
}

func TestStopResumesAPausedStandby(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{})
	standby := newStandby(t, primary, pgcluster.StandbyOptions{Synchronous: true})
	require.NoError(t, standby.PauseWALReceiver(ctx))

	// A fast shutdown of the primary waits until its standbys have
	// received the end of WAL: it would hang on a paused receiver.
	start := time.Now()
	require.NoError(t, primary.Stop(pgcluster.Fast), "the primary stopped on its own")
	require.NoError(t, standby.Stop(pgcluster.Fast), "the standby stopped on its own")
	require.Less(t, time.Since(start), 20*time.Second)
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func TestKilledPrimaryStaysDownAndThePromotedStandbyHasEveryAcknowledgedCommit(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{})
	standby := newStandby(t, primary, pgcluster.StandbyOptions{Synchronous: true})

	// The standby comes first: the URL must skip it while it is read-only.
	url := pgcluster.MultiHostURL("postgres", standby, primary)
	require.Equal(t, "postgres://postgres@127.0.0.1:"+strconv.Itoa(standby.Port())+",127.0.0.1:"+strconv.Itoa(primary.Port())+
		"/postgres?sslmode=disable&target_session_attrs=read-write", url)
	c := connect(t, ctx, url)
	var port int
	require.NoError(t, c.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, primary.Port(), port, "the multi-host URL reaches the primary")
	exec(t, ctx, c, `CREATE TABLE notes (id int PRIMARY KEY)`)
	for i := 1; i <= 50; i++ {
		exec(t, ctx, c, `INSERT INTO notes VALUES ($1)`, i)
	}

	pids := []int{primaryPID(t, primary)}
	rows, err := c.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()`)
	require.NoError(t, err)
	children, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.NotEmpty(t, children)
	pids = append(pids, children...)

	require.NoError(t, primary.Stop(pgcluster.Kill))
	require.False(t, primary.Running())
	for _, pid := range pids {
		require.False(t, alive(pid), "process %d of the killed primary still runs", pid)
	}
	_, err = pgx.Connect(ctx, primary.URL("postgres"))
	require.Error(t, err, "the killed primary takes no connection")
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "with the primary dead and the standby read-only, the URL reaches no primary")

	require.NoError(t, standby.Promote(ctx))
	in, err := standby.InRecovery(ctx)
	require.NoError(t, err)
	require.False(t, in, "the promoted standby left recovery")
	c2 := connect(t, ctx, url)
	require.NoError(t, c2.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, standby.Port(), port, "after the promotion the multi-host URL reaches the old standby")
	var n int
	require.NoError(t, c2.QueryRow(ctx, `SELECT count(*) FROM notes`).Scan(&n))
	require.Equal(t, 50, n, "every commit the primary acknowledged is on the promoted standby")
	exec(t, ctx, c2, `INSERT INTO notes VALUES (51)`)
	require.Error(t, standby.Promote(ctx), "a primary cannot be promoted")
}

func TestStandbyRefusesABadNameAndACommandLineSettingItCannotOverride(t *testing.T) {
	t.Parallel()
	primary := newCluster(t, pgcluster.Options{Settings: map[string]string{"synchronous_commit": "off"}})
	_, err := primary.Standby(context.Background(), pgcluster.StandbyOptions{Name: "Bad-Name"})
	require.ErrorContains(t, err, "StandbyOptions.Name")
	_, err = primary.Standby(context.Background(), pgcluster.StandbyOptions{Synchronous: true})
	require.ErrorContains(t, err, "synchronous_commit=off", "a setting ALTER SYSTEM cannot override is named")
	require.NoError(t, primary.SetSynchronousStandbys(context.Background()), "clearing the list needs no setting")
}
