package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
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

func (g gatedEcho) Run(ctx context.Context, turn Turn, tools ToolExecutor) (Reply, error) {
	if turn.ConversationID != g.gated {
		return Echo{}.Run(ctx, turn, tools)
	}
	g.started <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return Reply{}, context.Cause(ctx)
	}
	defer func() { g.answered <- struct{}{} }()
	return Echo{}.Run(ctx, turn, tools)
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
	ctx := context.Background()
	claimHeld, finalizeHeld := b.Conversation("claim-held"), b.Conversation("finalize-held")
	for _, c := range []string{"other-1", "other-2"} {
		b.Conversation(c)
	}
	agent := gatedEcho{gated: finalizeHeld, started: make(chan struct{}, 1), release: make(chan struct{}), answered: make(chan struct{}, 1)}
	reg := prometheus.NewRegistry()
	cfg := b.testConfig()
	cfg.Agent = agent
	cfg.Concurrency = 4
	// Long enough that no lease expires while the test holds a row.
	cfg.Lease = 30 * time.Second
	cfg.LockWait = 300 * time.Millisecond
	cfg.Registerer = reg
	b.startWorker(cfg)

	answered := func(c string) bool {
		return b.Count(`SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, b.Key(c)) == 1
	}
	// waiting is whether a session waits for a lock in a statement that
	// contains text: the turn's claim or finalize, behind the test's hold.
	// (The server keeps the first 1 kB of a statement's text.)
	const claimText, finalizeText = "unnest($1::text[], $2::text[], $3::float8[]", "unnest($1::text[], $2::text[], $3::text[]"
	waiting := func(text string) bool {
		return b.Count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, text) > 0
	}
	// hold holds a conversation's row in mode until the returned function
	// is called: FOR KEY SHARE (what a transaction that writes the
	// conversation's rows holds) stops a claim but lets a message in, FOR
	// SHARE stops a finalize too.
	hold := func(conversation, mode string) func() {
		tx, err := b.DB.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM conversations WHERE id = $1 FOR `+mode, conversation)
		require.NoError(t, err)
		return func() { require.NoError(t, tx.Rollback(ctx)) }
	}

	// A claim behind a held row.
	release := hold(claimHeld, "KEY SHARE")
	b.Send("claim-held", "c1", "hello")
	b.Eventually(20*time.Second, func() bool { return waiting(claimText) }, "the held conversation's claim waits for its row")
	b.Send("other-1", "o1", "hello")
	b.Eventually(20*time.Second, func() bool { return answered("other-1") }, "another conversation is answered while the held one's claim waits")
	// The claim waits for LockWait at a time: it gives up, and its trigger
	// comes back, while the row stays held.
	b.Eventually(20*time.Second, func() bool { return counter(reg, "baton_triggers_delayed_busy_total", "") >= 1 }, "the held conversation's claim gives up after LockWait")
	require.False(t, answered("claim-held"))
	release()
	b.Eventually(20*time.Second, func() bool { return answered("claim-held") }, "the held conversation is answered once its row is free")

	// A finalize behind a held row: the turn's model call ends while the
	// test holds its conversation.
	b.Send("finalize-held", "f1", "hello")
	receive(t, agent.started, "the held conversation's model call starts")
	release = hold(finalizeHeld, "SHARE")
	close(agent.release)
	receive(t, agent.answered, "the held conversation's model call ends")
	b.Eventually(20*time.Second, func() bool { return waiting(finalizeText) }, "the held conversation's finalize waits for its row")
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
	require.GreaterOrEqual(t, counter(reg, "baton_worker_turns_alone_total", "claim"), 1.0)
	require.GreaterOrEqual(t, counter(reg, "baton_worker_turns_alone_total", "finalize"), 1.0)
}

// counter is the value of the counter name in reg, of the series whose
// first label has value label ("" for a counter without labels).
func counter(reg *prometheus.Registry, name, label string) float64 {
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" || len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
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
	reg := prometheus.NewRegistry()
	cfg := b.testConfig()
	cfg.Pool = pool
	cfg.Registerer = reg
	cfg.Concurrency = 4
	cfg.Lease = 30 * time.Second
	cfg.LockWait = 10 * time.Second
	b.startWorker(cfg)

	tx, err := b.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM conversations WHERE id = ANY($1) FOR KEY SHARE`, held)
	require.NoError(t, err)
	b.Send("held-1", "h1", "hello")
	b.Send("held-2", "h2", "hello")
	waitingClaims := func() int {
		return b.Count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`,
			"unnest($1::text[], $2::text[], $3::float8[]")
	}
	// Sooner than LockWait: the second claim does not wait.
	b.Eventually(cfg.LockWait/2, func() bool { return counter(reg, "baton_triggers_delayed_busy_total", "") >= 1 && waitingClaims() == 1 },
		"one claim waits for its held conversation and the other delays its triggers")
	require.NoError(t, tx.Rollback(ctx))
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
