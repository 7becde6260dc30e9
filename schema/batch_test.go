package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// countingPool is a pool of b's database whose statements are counted.
func countingPool(t *testing.T, b turnBundle) (*pgxpool.Pool, *countingTracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, tracer
}

// TestClaimTurnsClaimsEachConversationOfABatchAsIfAlone: one statement
// claims several conversations, and each gets what ClaimTurn alone would
// give it: free ones their own rows, messages and history (a capped one
// its oldest rows and More), a held one BusyError, a waiting one
// WaitError, a missing one ErrConversationDeleted; and nothing is written
// for those it refused.
func TestClaimTurnsClaimsEachConversationOfABatchAsIfAlone(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	pool, tracer := countingPool(t, b)
	for _, c := range []string{"a", "b", "capped", "busy", "waits"} {
		b.conversation(t, c)
	}
	b.send(t, "a", "a1", "a one")
	c0, err := b.claim(t, "a", "run-a0", time.Minute)
	require.NoError(t, err)
	_, err = b.finalize(t, c0, "run-a0")
	require.NoError(t, err)
	a2 := b.send(t, "a", "a2", "a two")
	b1 := b.send(t, "b", "b1", "b one")
	b2 := b.send(t, "b", "b2", "b two")
	capped1 := b.send(t, "capped", "x1", "x one")
	b.send(t, "capped", "x2", "x two")
	b.send(t, "busy", "y1", "y one")
	_, err = b.claim(t, "busy", "run-owner", time.Minute)
	require.NoError(t, err)
	b.send(t, "busy", "y2", "y two")
	b.send(t, "waits", "z1", "z one")
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET not_before = now() + interval '1 minute' WHERE id = $1`, b.key("waits"))
	require.NoError(t, err)

	params := func(conv, run string) schema.ClaimParams {
		return schema.ClaimParams{ConversationID: conv, RunID: run, Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	}
	capped := params(b.key("capped"), "run-capped")
	capped.MaxRows = 1
	tracer.n.Store(0)
	res := schema.ClaimTurns(ctx, pool, []schema.ClaimParams{
		params(b.key("busy"), "run-busy"),
		params(b.key("a"), "run-a"),
		params("c_gone", "run-gone"),
		capped,
		params(b.key("waits"), "run-waits"),
		params(b.key("b"), "run-b"),
	}, 10)
	require.EqualValues(t, 1, tracer.n.Load(), "the batch is one statement")
	require.Len(t, res, 6)

	var busy *schema.BusyError
	require.ErrorAs(t, res[0].Err, &busy)
	require.Equal(t, "run-owner", busy.RunID)

	require.NoError(t, res[1].Err)
	require.Equal(t, []int64{a2}, res[1].Claim.OutboxIDs)
	require.Equal(t, "run-a", res[1].Claim.RunID)
	require.Equal(t, b.turnID(t, "a", []int64{a2}, 0), res[1].Claim.TurnID)
	require.Equal(t, []string{"a two"}, contents(res[1].Input.Messages))
	require.Equal(t, []string{"a one", "answer"}, contents(res[1].Input.History), "each conversation's own history")

	require.ErrorIs(t, res[2].Err, schema.ErrConversationDeleted)

	require.NoError(t, res[3].Err)
	require.Equal(t, []int64{capped1}, res[3].Claim.OutboxIDs, "a capped claim takes the oldest rows")
	require.True(t, res[3].Claim.More)

	var wait *schema.WaitError
	require.ErrorAs(t, res[4].Err, &wait)

	require.NoError(t, res[5].Err)
	require.Equal(t, []int64{b1, b2}, res[5].Claim.OutboxIDs)
	require.Equal(t, []string{"b one", "b two"}, contents(res[5].Input.Messages))
	require.Empty(t, res[5].Input.History)

	require.Equal(t, []string{"processing", "pending"}, b.statuses(t, "busy"), "the held conversation's new row is left alone")
	require.Equal(t, []string{"pending"}, b.statuses(t, "waits"))
	require.Equal(t, []string{"processing", "pending"}, b.statuses(t, "capped"))
	require.Equal(t, []string{"processing", "processing"}, b.statuses(t, "b"))
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM conversations WHERE run_id = 'run-owner'`))
	require.Equal(t, 3, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id IN ('run-a', 'run-b', 'run-capped') AND status = 'running'`))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id IN ('run-busy', 'run-waits', 'run-gone')`), "no run is recorded for a refused claim")

	// The turns that were claimed end in one statement too.
	var fs []schema.Finalize
	for _, r := range []schema.ClaimResult{res[1], res[3], res[5]} {
		fs = append(fs, schema.Finalize{ConversationID: r.Claim.ConversationID, RunID: r.Claim.RunID, TurnID: r.Claim.TurnID, OutboxIDs: r.Claim.OutboxIDs, Content: "answer"})
	}
	tracer.n.Store(0)
	for i, f := range schema.FinalizeTurns(ctx, pool, fs) {
		require.NoError(t, f.Err, "turn %d", i)
	}
	require.EqualValues(t, 1, tracer.n.Load(), "the batch is one statement")
	require.Equal(t, []string{"done", "done"}, b.statuses(t, "a"))
	require.Equal(t, []string{"done", "pending"}, b.statuses(t, "capped"))

	// A conversation asked for twice in one batch is refused the second
	// time, and the first claim stands.
	b.send(t, "a", "a3", "a three")
	res = schema.ClaimTurns(ctx, pool, []schema.ClaimParams{params(b.key("a"), "run-a2"), params(b.key("a"), "run-a3")}, 10)
	require.NoError(t, res[0].Err)
	require.Len(t, res[0].Claim.OutboxIDs, 1)
	require.ErrorContains(t, res[1].Err, "asked for twice")
}

// TestFinalizeTurnsCommitsEachTurnOnItsOwnFence: one statement finalizes
// several turns, each all or nothing on its own fence: turns whose run owns
// its conversation reply; a run that lost its lease gets ErrLeaseLost and
// writes nothing; a turn with a newer message pending is handed back; a
// turn of a deleted conversation is cancelled.
func TestFinalizeTurnsCommitsEachTurnOnItsOwnFence(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	pool, _ := countingPool(t, b)
	claims := map[string]schema.Claim{}
	for _, c := range []string{"a", "lost", "b", "newer", "gone"} {
		b.conversation(t, c)
		b.send(t, c, c+"1", c+" one")
		res := schema.ClaimTurns(ctx, pool, []schema.ClaimParams{{ConversationID: b.key(c), RunID: "run-" + c, Worker: "w", Lease: time.Minute, MaxAttempts: 3}}, 10)
		require.NoError(t, res[0].Err)
		claims[c] = res[0].Claim
	}
	// "lost": another run recovered the conversation meanwhile.
	_, err := b.db.Pool.Exec(ctx, `UPDATE conversations SET run_id = 'run-other' WHERE id = $1`, b.key("lost"))
	require.NoError(t, err)
	b.send(t, "newer", "newer2", "newer two")
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM conversations WHERE id = $1`, b.key("gone"))
	require.NoError(t, err)

	fin := func(c string, supersede bool) schema.Finalize {
		cl := claims[c]
		return schema.Finalize{ConversationID: cl.ConversationID, RunID: cl.RunID, TurnID: cl.TurnID, OutboxIDs: cl.OutboxIDs, Content: "answer " + c, SupersedeIfNewer: supersede}
	}
	res := schema.FinalizeTurns(ctx, pool, []schema.Finalize{fin("a", true), fin("lost", false), fin("b", false), fin("newer", true), fin("gone", false), fin("a", false)})
	require.Len(t, res, 6)
	require.ErrorContains(t, res[5].Err, "asked for twice", "a run finalized twice in one batch is refused the second time")
	require.NoError(t, res[0].Err)
	require.Equal(t, claims["a"].ReplyID(), res[0].Finalized.MessageID)
	require.ErrorIs(t, res[1].Err, schema.ErrLeaseLost)
	require.NoError(t, res[2].Err)
	require.NoError(t, res[3].Err)
	require.True(t, res[3].Finalized.Superseded, "a newer message hands the turn back")
	require.ErrorIs(t, res[4].Err, schema.ErrConversationDeleted)

	require.Equal(t, []string{"done"}, b.statuses(t, "a"))
	require.Equal(t, []string{"done"}, b.statuses(t, "b"))
	require.Equal(t, []string{"processing"}, b.statuses(t, "lost"), "a run that lost its lease writes nothing")
	require.Equal(t, []string{"pending", "pending"}, b.statuses(t, "newer"))
	require.Equal(t, 2, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))
	require.Equal(t, 2, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE status = 'finalized'`))
	require.Equal(t, 0, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM conversations WHERE run_id IS NOT NULL AND id IN ($1, $2)`, b.key("a"), b.key("b")), "the answered conversations are released")
}

// TestABatchTheServerRefusesIsRunOneByOne: a reply PostgreSQL cannot store
// (a NUL character) or a conversation key it cannot read fails the
// statement of the whole batch; each is then run alone, so only that one
// fails, with the server's reason, and the others go through.
func TestABatchTheServerRefusesIsRunOneByOne(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	var ps []schema.ClaimParams
	for _, c := range []string{"a", "b"} {
		b.conversation(t, c)
		b.send(t, c, c+"1", c+" one")
		ps = append(ps, schema.ClaimParams{ConversationID: b.key(c), RunID: "run-" + c, Worker: "w", Lease: time.Minute, MaxAttempts: 3})
	}
	bad := schema.ClaimParams{ConversationID: "c_bad\x00key", RunID: "run-bad", Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	claims := schema.ClaimTurns(ctx, b.db.Pool, []schema.ClaimParams{ps[0], bad, ps[1]}, 10)
	require.NoError(t, claims[0].Err)
	require.ErrorContains(t, claims[1].Err, "0x00")
	require.NoError(t, claims[2].Err)
	require.Len(t, claims[2].Claim.OutboxIDs, 1)

	fin := func(c schema.Claim, content string) schema.Finalize {
		return schema.Finalize{ConversationID: c.ConversationID, RunID: c.RunID, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: content}
	}
	res := schema.FinalizeTurns(ctx, b.db.Pool, []schema.Finalize{fin(claims[0].Claim, "bad \x00 reply"), fin(claims[2].Claim, "good")})
	require.ErrorContains(t, res[0].Err, "0x00")
	require.NoError(t, res[1].Err)
	require.Equal(t, []string{"processing"}, b.statuses(t, "a"), "the refused turn keeps its rows")
	require.Equal(t, []string{"done"}, b.statuses(t, "b"))
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))
}

// TestTheBatchesThatDoNotWaitSkipAHeldConversationAndDoTheRest: while
// another transaction holds one conversation's row (an operator's open
// transaction, a long delete), ClaimTurnsNoWait and FinalizeTurnsNoWait
// do the other turns at once and return ErrRunAlone for that one, writing
// nothing for it; so do they for a conversation whose expired run must be
// recovered first and for a turn a newer message supersedes. Run alone,
// each of those then waits for the lock and goes through as before; a
// claim alone within a bound gives up past it and never claims later. Each
// statement runs under a deadline: one that waited for the held row would
// fail the test with it.
func TestTheBatchesThatDoNotWaitSkipAHeldConversationAndDoTheRest(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	for _, c := range []string{"held", "free", "expired", "newer"} {
		b.conversation(t, c)
		b.send(t, c, c+"1", c+" one")
	}
	params := func(c, run string) schema.ClaimParams {
		return schema.ClaimParams{ConversationID: b.key(c), RunID: run, Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	}
	b.expire(t, "expired", "run-dead")
	b.send(t, "expired", "expired2", "expired two")

	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE`, b.key("held"))
	require.NoError(t, err)

	quick, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	claims := schema.ClaimTurnsNoWait(quick, b.db.Pool, []schema.ClaimParams{
		params("held", "run-held"), params("free", "run-free"), params("expired", "run-expired"), params("newer", "run-newer"),
	}, 10)
	require.ErrorIs(t, claims[0].Err, schema.ErrRunAlone, "the held conversation is skipped")
	require.NoError(t, claims[1].Err)
	require.Len(t, claims[1].Claim.OutboxIDs, 1, "the free conversation is claimed")
	require.ErrorIs(t, claims[2].Err, schema.ErrRunAlone, "the expired run is left to a claim of its own")
	require.NoError(t, claims[3].Err)
	require.Equal(t, []string{"pending"}, b.statuses(t, "held"), "nothing is written for the held conversation")
	require.Equal(t, []string{"processing", "pending"}, b.statuses(t, "expired"), "nor for the expired one")
	require.Equal(t, 0, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id IN ('run-held', 'run-expired')`))

	// Alone, the expired run is recovered and its rows claimed.
	c, _, err := schema.ClaimTurn(quick, b.db.Pool, params("expired", "run-expired"), 10)
	require.NoError(t, err)
	require.Len(t, c.OutboxIDs, 2)
	require.NotNil(t, c.Recovered)

	// Alone and within a bound, it gives up past the bound, and the server
	// claims nothing then or later: the claim below gets the rows.
	_, _, err = schema.ClaimTurnWithin(quick, b.db.Pool, params("held", "run-bounded"), 10, 100*time.Millisecond)
	require.ErrorIs(t, err, schema.ErrLockWait)
	require.Equal(t, []string{"pending"}, b.statuses(t, "held"))

	// Alone, the held conversation's claim waits for the lock.
	claimed := make(chan schema.ClaimResult, 1)
	go func() {
		c, in, err := schema.ClaimTurn(ctx, b.db.Pool, params("held", "run-held"), 10)
		claimed <- schema.ClaimResult{Claim: c, Input: in, Err: err}
	}()
	b.eventuallyWaitsForLock(t, "the lone claim waits for the held conversation")
	require.NoError(t, holder.Rollback(ctx))
	held := <-claimed
	require.NoError(t, held.Err)
	require.Len(t, held.Claim.OutboxIDs, 1)
	require.Equal(t, 0, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id = 'run-bounded'`), "the bounded claim that gave up never claims")

	// Finalizes: the held conversation again, and a newer message for one.
	holder, err = b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE`, b.key("held"))
	require.NoError(t, err)
	b.send(t, "newer", "newer2", "newer two")
	fin := func(c schema.Claim, supersede bool) schema.Finalize {
		return schema.Finalize{ConversationID: c.ConversationID, RunID: c.RunID, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "answer", SupersedeIfNewer: supersede}
	}
	res := schema.FinalizeTurnsNoWait(quick, b.db.Pool, []schema.Finalize{fin(held.Claim, false), fin(claims[1].Claim, false), fin(claims[3].Claim, true)})
	require.ErrorIs(t, res[0].Err, schema.ErrRunAlone, "the held conversation is skipped")
	require.NoError(t, res[1].Err)
	require.ErrorIs(t, res[2].Err, schema.ErrRunAlone, "handing back a superseded turn is left to a finalize of its own")
	require.Equal(t, []string{"processing"}, b.statuses(t, "held"), "nothing is written for the held conversation")
	require.Equal(t, []string{"done"}, b.statuses(t, "free"))
	require.Equal(t, []string{"processing", "pending"}, b.statuses(t, "newer"), "nor for the superseded turn")

	out, err := schema.FinalizeTurn(quick, b.db.Pool, fin(claims[3].Claim, true))
	require.NoError(t, err)
	require.True(t, out.Superseded, "alone, the superseded turn is handed back")
	require.Equal(t, []string{"pending", "pending"}, b.statuses(t, "newer"))

	finalized := make(chan error, 1)
	go func() {
		_, err := schema.FinalizeTurn(ctx, b.db.Pool, fin(held.Claim, false))
		finalized <- err
	}()
	b.eventuallyWaitsForLock(t, "the lone finalize waits for the held conversation")
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-finalized)
	require.Equal(t, []string{"done"}, b.statuses(t, "held"))
	require.Equal(t, 2, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))
}

// eventuallyWaitsForLock waits until a session of b's database waits for a
// lock.
func (b turnBundle) eventuallyWaitsForLock(t *testing.T, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return testenv.Count(t, b.db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 5*time.Millisecond, what)
}

// TestABoundedClaimThatGivesUpWhileRecoveringLeavesTheExpiredRunAsItWas:
// the recovery of an expired run inside ClaimTurnWithin waits for outbox
// rows another transaction holds; past the bound the whole claim gives up
// with ErrLockWait and the recovery is undone with it: the dead run still
// owns the conversation and its rows are still processing. Once the rows
// are free, a claim recovers the run and takes them.
func TestABoundedClaimThatGivesUpWhileRecoveringLeavesTheExpiredRunAsItWas(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	b.expire(t, "c", "run-dead")
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM agent_outbox WHERE conversation_id = $1 FOR UPDATE`, b.key("c"))
	require.NoError(t, err)

	p := schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-new", Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	quick, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, _, err = schema.ClaimTurnWithin(quick, b.db.Pool, p, 10, 100*time.Millisecond)
	require.ErrorIs(t, err, schema.ErrLockWait)
	require.Equal(t, []string{"processing"}, b.statuses(t, "c"))
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM conversations WHERE id = $1 AND run_id = 'run-dead'`, b.key("c")), "the dead run still owns the conversation")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id = 'run-dead' AND status = 'running'`), "the dead run is not marked recovered")
	require.Equal(t, 0, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id = 'run-new'`))

	require.NoError(t, holder.Rollback(ctx))
	c, _, err := schema.ClaimTurnWithin(quick, b.db.Pool, p, 10, 100*time.Millisecond)
	require.NoError(t, err)
	require.NotNil(t, c.Recovered, "the claim recovers the dead run once the rows are free")
	require.Len(t, c.OutboxIDs, 1)
}
