package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// workerSession is a worker's session held on a connection of its own, as
// a worker process holds it; close ends the connection, as a process that
// dies does.
type workerSession struct {
	id   int32
	conn *pgx.Conn
	db   *pgxpool.Pool
}

func (b turnBundle) takeSession(t *testing.T) *workerSession {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	id, err := schema.NextWorkerSession(ctx, conn)
	require.NoError(t, err)
	took, err := schema.TakeWorkerSession(ctx, conn, id)
	require.NoError(t, err)
	require.True(t, took, "a new session's lock is free")
	return &workerSession{id: id, conn: conn, db: b.db.Pool}
}

func (s *workerSession) close(t *testing.T) {
	t.Helper()
	require.NoError(t, s.conn.Close(context.Background()))
	// Close returns once the client said goodbye; the server's backend
	// releases the lock as it exits, a moment later, as it does for a
	// process that died.
	require.Eventually(t, func() bool {
		var held bool
		err := s.db.QueryRow(context.Background(),
			`SELECT $1::integer IN (SELECT baton_worker_sessions_held())`, s.id).Scan(&held)
		return err == nil && !held
	}, 10*time.Second, 5*time.Millisecond, "the server released session %d's lock after its connection closed", s.id)
}

// trustSessions makes free locks count on this server now, as they do ten
// seconds after the first worker took its lock (or ages the record back
// into the grace with since < 10s).
func (b turnBundle) trustSessions(t *testing.T, since time.Duration) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO worker_session_epochs (server_started_at, first_session_at)
		VALUES (pg_postmaster_start_time(), now() - make_interval(secs => $1))
		ON CONFLICT (server_started_at) DO UPDATE SET first_session_at = excluded.first_session_at`, since.Seconds())
	require.NoError(t, err)
}

func (b turnBundle) claimAs(t *testing.T, conversationID, runID string, session int32) (schema.Claim, error) {
	t.Helper()
	c, _, err := schema.ClaimTurn(context.Background(), b.db.Pool, schema.ClaimParams{
		ConversationID: b.key(conversationID), RunID: runID, Worker: "test", Lease: time.Minute, MaxAttempts: 3, Session: session,
	}, 10)
	return c, err
}

// TestAClaimTakesOverAtOnceFromAWorkerWhoseSessionEnded: a run holds a
// lease of a minute; while its worker's session lock is held, another
// claim finds the conversation busy; once the session's connection is
// gone, the next claim recovers the run and takes the conversation at
// once, long before the lease would expire, and the old run's finalize is
// fenced out.
func TestAClaimTakesOverAtOnceFromAWorkerWhoseSessionEnded(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.trustSessions(t, time.Minute)
	b.conversation(t, "c")
	b.send(t, "c", "m1", "hello")
	first := b.takeSession(t)
	second := b.takeSession(t)
	require.NotEqual(t, first.id, second.id, "each worker gets a session of its own")

	c1, err := b.claimAs(t, "c", "run_1", first.id)
	require.NoError(t, err)
	require.False(t, c1.Empty())

	_, err = b.claimAs(t, "c", "run_2", second.id)
	var busy *schema.BusyError
	require.ErrorAs(t, err, &busy, "the first worker is alive: its lease holds")

	first.close(t)
	c2, err := b.claimAs(t, "c", "run_2", second.id)
	require.NoError(t, err, "the first worker's session ended: the claim takes over without waiting for the lease")
	require.NotNil(t, c2.Recovered, "the gone worker's run is recovered inside the claim")
	require.Equal(t, schema.RecoveryRetry, c2.Recovered.Outcome)
	require.Equal(t, c1.OutboxIDs, c2.OutboxIDs, "the new run answers the same message")
	var reason string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT error FROM agent_runs WHERE id = 'run_1'`).Scan(&reason))
	require.Equal(t, schema.RecoveryReasonSessionEnded, reason)

	_, err = b.finalize(t, c1, "run_1")
	require.ErrorIs(t, err, schema.ErrLeaseLost, "the old run writes nothing after the takeover")
	_, err = b.finalize(t, c2, "run_2")
	require.NoError(t, err)
}

// TestRunsOfAGoneWorkerAreRecoveredAndAnnouncedAtOnce: RecoverOrphanedTx
// recovers the runs whose worker's session ended, and only those; a run
// without a session, and a live worker's, keep their leases.
func TestRunsOfAGoneWorkerAreRecoveredAndAnnouncedAtOnce(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.trustSessions(t, time.Minute)
	gone, alive := b.takeSession(t), b.takeSession(t)
	for _, c := range []string{"gone", "alive", "none"} {
		b.conversation(t, c)
		b.send(t, c, c+"-m1", "hello")
	}
	_, err := b.claimAs(t, "gone", "run_gone", gone.id)
	require.NoError(t, err)
	_, err = b.claimAs(t, "alive", "run_alive", alive.id)
	require.NoError(t, err)
	_, err = b.claimAs(t, "none", "run_none", 0)
	require.NoError(t, err)
	gone.close(t)

	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		recs, err = schema.RecoverOrphanedTx(context.Background(), tx, 100, 3)
		return err
	}))
	require.Len(t, recs, 1, "only the run of the gone worker is recovered: %+v", recs)
	require.Equal(t, "run_gone", recs[0].RunID)
	require.Equal(t, schema.RecoveryRetry, recs[0].Outcome)
	require.Equal(t, []string{"pending"}, b.statuses(t, "gone"), "its message is pending again, for the next turn")
	require.Equal(t, []string{"processing"}, b.statuses(t, "alive"))
	require.Equal(t, []string{"processing"}, b.statuses(t, "none"))
}

// TestAFreeLockCountsOnlyOnceTheServerHeldWorkersLocksForAWhile: right
// after a restart or a promotion no worker holds its lock yet, though
// they are alive and reconnecting; until ten seconds after the first took
// its lock again, a free lock takes nothing over and the lease decides.
func TestAFreeLockCountsOnlyOnceTheServerHeldWorkersLocksForAWhile(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.trustSessions(t, 2*time.Second)
	b.conversation(t, "c")
	b.send(t, "c", "m1", "hello")
	reconnecting := b.takeSession(t)
	_, err := b.claimAs(t, "c", "run_1", reconnecting.id)
	require.NoError(t, err)
	reconnecting.close(t)

	_, err = b.claimAs(t, "c", "run_2", 0)
	var busy *schema.BusyError
	require.ErrorAs(t, err, &busy, "within the grace after the server's first lock, a free lock is a worker that may still be reconnecting")
	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		recs, err = schema.RecoverOrphanedTx(context.Background(), tx, 100, 3)
		return err
	}))
	require.Empty(t, recs, "nothing is recovered within the grace")

	b.trustSessions(t, 11*time.Second)
	_, err = b.claimAs(t, "c", "run_2", 0)
	require.NoError(t, err, "past the grace, the free lock is a gone worker")
}

// TestAWorkerTakesItsSessionAgainOnlyOnceItsPreviousConnectionIsGone: a
// worker that reconnects while the server still holds its previous
// connection (a link that broke without the server noticing) cannot take
// the same session twice; it can once that connection ends.
func TestAWorkerTakesItsSessionAgainOnlyOnceItsPreviousConnectionIsGone(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	old := b.takeSession(t)
	conn, err := pgx.Connect(context.Background(), b.db.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	took, err := schema.TakeWorkerSession(context.Background(), conn, old.id)
	require.NoError(t, err)
	require.False(t, took, "the previous connection still holds the session")
	// The server ends the previous connection, and says when its backend
	// is gone (a client's close returns before the backend has exited and
	// let its locks go).
	var ended bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 10000)`, old.conn.PgConn().PID()).Scan(&ended))
	require.True(t, ended, "the previous connection's backend ended within 10 s")
	took, err = schema.TakeWorkerSession(context.Background(), conn, old.id)
	require.NoError(t, err)
	require.True(t, took, "once it is gone, the session is taken again")
}
