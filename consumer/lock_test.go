package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/setting"
)

// gatedEcho is the echo agent, except that a turn of the conversation
// gated says so on started and waits for release before answering.
type gatedEcho struct {
	gated    string
	started  chan struct{}
	release  chan struct{}
	answered chan struct{}
}

func (g gatedEcho) Step(ctx context.Context, req StepRequest) (Step, error) {
	if req.Turn.ConversationID != g.gated {
		return Echo{}.Step(ctx, req)
	}
	g.started <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return Step{}, context.Cause(ctx)
	}
	defer func() { g.answered <- struct{}{} }()
	return Echo{}.Step(ctx, req)
}

// TestAConversationAnotherTransactionHoldsHoldsUpOnlyItsOwnTurn: while a
// transaction outside the worker holds one conversation's row (an
// operator's open transaction, a long delete), that conversation's claim,
// and later its finalize, waits for it on its own: the worker's other
// conversations are claimed, answered and finalized meanwhile, and once
// the row is free the held turns end with their one reply.
func TestAConversationAnotherTransactionHoldsHoldsUpOnlyItsOwnTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimHeld, finalizeHeld := b.Conversation("claim-held"), b.Conversation("finalize-held")
	for _, c := range []string{"other-1", "other-2"} {
		b.Conversation(c)
	}
	agent := gatedEcho{gated: finalizeHeld, started: make(chan struct{}, 1), release: make(chan struct{}), answered: make(chan struct{}, 1)}
	cfg := b.testConfig()
	cfg.Agent = agent
	cfg.Concurrency = 4
	// Long enough that no lease expires while the test holds a row.
	cfg.Lease = 30 * time.Second
	cfg.LockWait = 300 * time.Millisecond
	w := b.startWorker(cfg)

	answered := func(c string) bool {
		return b.Count(`SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, b.Key(c)) == 1
	}
	// A claim behind a held row.
	release := b.hold("KEY SHARE", claimHeld)
	b.Send("claim-held", "c1", "hello")
	b.Eventually(20*time.Second, func() bool { return b.waitingForLock(claimText) > 0 }, "the held conversation's claim waits for its row")
	b.Send("other-1", "o1", "hello")
	b.Eventually(20*time.Second, func() bool { return answered("other-1") }, "another conversation is answered while the held one's claim waits")
	// The claim waits for LockWait at a time: it gives up, and its trigger
	// comes back, while the row stays held.
	b.Eventually(20*time.Second, func() bool { return testutil.ToFloat64(w.metrics.busy) >= 1 }, "the held conversation's claim gives up after LockWait")
	require.False(t, answered("claim-held"))
	release()
	b.Eventually(20*time.Second, func() bool { return answered("claim-held") }, "the held conversation is answered once its row is free")

	// A finalize behind a held row: the turn's model call ends while the
	// test holds its conversation.
	b.Send("finalize-held", "f1", "hello")
	receive(t, agent.started, "the held conversation's model call starts")
	release = b.hold("SHARE", finalizeHeld)
	close(agent.release)
	receive(t, agent.answered, "the held conversation's model call ends")
	b.Eventually(20*time.Second, func() bool { return b.waitingForLock(finalizeText) > 0 }, "the held conversation's finalize waits for its row")
	b.Send("other-2", "o2", "hello")
	// Within less than commitTimeout: a finalize statement that waited
	// for the held row would give up after that, and let other-2's go.
	b.Eventually(commitTimeout*2/3, func() bool { return answered("other-2") }, "another conversation is answered while the held one's finalize waits")
	require.False(t, answered("finalize-held"))
	release()

	b.settled(30 * time.Second)
	for _, c := range []string{"claim-held", "finalize-held", "other-1", "other-2"} {
		require.True(t, answered(c), "%s has its one reply", c)
	}
	require.Equal(t, 4, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
	// Each held turn ran alone at least once; a producer's commit seen
	// mid-way can send another turn alone too.
	require.GreaterOrEqual(t, testutil.ToFloat64(w.metrics.alone.WithLabelValues("claim")), 1.0)
	require.GreaterOrEqual(t, testutil.ToFloat64(w.metrics.alone.WithLabelValues("finalize")), 1.0)
}

// The texts of the claim and the finalize statements, as the server shows
// them in pg_stat_activity (their first 1 kB).
const claimText, finalizeText = "unnest($1::text[], $2::text[], $3::float8[]", "unnest($1::text[], $2::text[], $3::integer[]"

// waitingForLock counts the sessions that wait for a lock in a statement
// that contains text: a turn's claim or finalize, behind a test's hold.
func (b *bundle) waitingForLock(text string) int {
	return b.Count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, text)
}

// hold holds the conversations' rows in mode until the returned function
// is called: FOR KEY SHARE (what a transaction that writes the
// conversation's rows holds) stops a claim but lets a message in, FOR
// SHARE stops a finalize too.
func (b *bundle) hold(mode string, conversations ...string) (release func()) {
	t := b.T
	ctx := context.Background()
	tx, err := b.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM conversations WHERE id = ANY($1) FOR `+mode, conversations)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

// receive waits for a value on c, for at most 20 s.
func receive[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("after 20s: %s", what)
		panic("unreachable")
	}
}

// TestAtMostAQuarterOfThePoolWaitsForHeldConversations: with a pool of 4
// connections, one claim at a time waits on its own for a held
// conversation; the claim of a second held conversation does not take
// another connection to wait too, but delays its triggers at once. Both
// are answered once their rows are free.
func TestAtMostAQuarterOfThePoolWaitsForHeldConversations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	held := []string{b.Conversation("held-1"), b.Conversation("held-2")}
	pcfg, err := pgxpool.ParseConfig(b.DB.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := b.testConfig()
	cfg.Concurrency = 4
	cfg.Lease = 30 * time.Second
	cfg.LockWait = 10 * time.Second
	w := b.startWorkerOn(cfg, pool)

	release := b.hold("KEY SHARE", held...)
	b.Send("held-1", "h1", "hello")
	b.Send("held-2", "h2", "hello")
	// Sooner than LockWait: the second claim does not wait.
	b.Eventually(cfg.LockWait/2, func() bool { return testutil.ToFloat64(w.metrics.busy) >= 1 && b.waitingForLock(claimText) == 1 },
		"one claim waits for its held conversation and the other delays its triggers")
	release()
	b.settled(30 * time.Second)
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "each held conversation answered once")
}

// TestALockWaitOutsideItsRangeIsRefused: LockWait defaults to 5s or a
// third of the lease, whichever is shorter, and must be shorter than the
// lease.
func TestALockWaitOutsideItsRangeIsRefused(t *testing.T) {
	t.Parallel()
	require.Equal(t, DefaultLockWait, Config{}.WithDefaults().LockWait)
	require.Equal(t, time.Second, Config{Lease: 3 * time.Second}.WithDefaults().LockWait)
	for _, wait := range []time.Duration{-time.Second, DefaultLease, 2 * DefaultLease} {
		err := Config{LockWait: wait}.WithDefaults().Validate()
		var serr *setting.Error
		require.ErrorAs(t, err, &serr, "LockWait %s", wait)
		require.Equal(t, "LockWait", serr.Field)
	}
	require.NoError(t, Config{LockWait: time.Second}.WithDefaults().Validate())
}
