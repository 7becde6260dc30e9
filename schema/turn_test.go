package schema_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAFreeConversationsTurnIsClaimedAndFinalizedInOneStatementEach: the
// worker's path claims and loads a free conversation's turn in one
// statement (the rows, the turn id, the messages, the history before them,
// the lease) and finalizes it in one more (the reply, the rows done, the
// conversation released, the run finalized), fenced by the run. In a
// caller's transaction, ClaimTx and FinalizeTx are one statement each too.
func TestAFreeConversationsTurnIsClaimedAndFinalizedInOneStatementEach(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c0, err := b.claim(t, "c", "run-0", time.Minute)
	require.NoError(t, err)
	_, err = b.finalize(t, c0, "run-0") // history: one, answer
	require.NoError(t, err)
	id2 := b.send(t, "c", "m2", "two")
	id3 := b.send(t, "c", "m3", "three")

	tracer.n.Store(0)
	c, in, err := schema.ClaimTurn(ctx, pool, schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-1", Worker: "w", Lease: time.Minute, MaxAttempts: 3}, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, tracer.n.Load(), "a free conversation's claim and load are one statement")
	require.Equal(t, []int64{id2, id3}, c.OutboxIDs)
	require.Equal(t, b.turnID(t, "c", []int64{id2, id3}, 0), c.TurnID, "the turn id derives from the claimed rows")
	require.Equal(t, 1, c.Attempts)
	require.False(t, c.More)
	require.WithinDuration(t, time.Now().Add(time.Minute), c.LeaseExpiresAt, 10*time.Second)
	require.Equal(t, []string{"two", "three"}, contents(in.Messages))
	require.Equal(t, []string{"one", "answer"}, contents(in.History), "history is what came before, without the turn's own rows")
	require.Equal(t, []string{"done", "processing", "processing"}, b.statuses(t, "c"))

	_, err = schema.FinalizeTurn(ctx, pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-intruder", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "no"})
	require.ErrorIs(t, err, schema.ErrLeaseLost, "a run that does not own the conversation cannot finalize")

	tracer.n.Store(0)
	out, err := schema.FinalizeTurn(ctx, pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-1", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "answer 2", Truncated: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, tracer.n.Load(), "finalize is one statement")
	require.Equal(t, c.ReplyID(), out.MessageID)
	require.Equal(t, []string{"done", "done", "done"}, b.statuses(t, "c"))
	var runID *string
	var unread int
	var truncated bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT run_id, unread_count FROM conversations WHERE id = $1`, b.key("c")).Scan(&runID, &unread))
	require.Nil(t, runID, "finalize releases the conversation")
	require.Equal(t, 2, unread)
	require.NoError(t, pool.QueryRow(ctx, `SELECT truncated FROM messages WHERE id = $1`, out.MessageID).Scan(&truncated))
	require.True(t, truncated)
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM agent_runs WHERE id = 'run-1'`).Scan(&status))
	require.Equal(t, "finalized", status)

	// A second finalize of the same turn (a redelivery) adds nothing.
	_, err = schema.FinalizeTurn(ctx, pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-1", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "again"})
	require.ErrorIs(t, err, schema.ErrLeaseLost)
	require.Equal(t, 2, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))

	id4 := b.send(t, "c", "m4", "four")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	tracer.n.Store(0)
	c4, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-2", Worker: "w", Lease: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	require.EqualValues(t, 1, tracer.n.Load(), "ClaimTx of a free conversation is one statement")
	require.Equal(t, []int64{id4}, c4.OutboxIDs)
	require.Equal(t, b.turnID(t, "c", []int64{id4}, 0), c4.TurnID)
	require.Equal(t, 1, c4.Attempts)
	tracer.n.Store(0)
	out, err = schema.FinalizeTx(ctx, tx, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c4.TurnID, OutboxIDs: c4.OutboxIDs, Content: "answer 4"})
	require.NoError(t, err)
	require.EqualValues(t, 1, tracer.n.Load(), "FinalizeTx is one statement")
	require.Equal(t, c4.ReplyID(), out.MessageID)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"done", "done", "done", "done"}, b.statuses(t, "c"))
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM agent_runs WHERE id = 'run-2'`).Scan(&status))
	require.Equal(t, "finalized", status)
}

// TestClaimTurnSaysWhyItClaimsNothing: a held conversation is busy, a
// waiting one waits, a deleted one is gone, an expired owner is recovered
// on the way, and a cap leaves the rest for the next turn.
func TestClaimTurnSaysWhyItClaimsNothing(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	b.send(t, "c", "m2", "two")
	p := schema.ClaimParams{ConversationID: b.key("c"), Worker: "w", Lease: time.Minute, MaxAttempts: 3, MaxRows: 1}

	p.RunID = "run-1"
	c, in, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	require.Len(t, c.OutboxIDs, 1)
	require.True(t, c.More, "the cap leaves a row for the next turn")
	require.Equal(t, []string{"one"}, contents(in.Messages))

	p.RunID = "run-2"
	_, _, err = schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.ErrorIs(t, err, schema.ErrConversationBusy)

	// The owner's lease expires: the next claim recovers it (back to
	// pending) and takes the oldest row again.
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.key("c"))
	require.NoError(t, err)
	c, _, err = schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	require.NotNil(t, c.Recovered, "the expired run was recovered inline")
	require.Len(t, c.OutboxIDs, 1)
	require.Equal(t, 2, c.Attempts, "the recovered row's attempt counted")

	_, err = schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "a"})
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET not_before = now() + interval '1 hour' WHERE id = $1`, b.key("c"))
	require.NoError(t, err)
	p.RunID = "run-3"
	_, _, err = schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.ErrorIs(t, err, schema.ErrConversationWaiting)

	_, err = schema.DeleteConversation(ctx, b.db.Pool, b.owner, "c")
	require.NoError(t, err)
	_, _, err = schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.ErrorIs(t, err, schema.ErrConversationDeleted)
}

// TestFinalizeTurnHandsATurnBackForANewerMessage: with SupersedeIfNewer, a
// newer pending message makes finalize hand the turn back (rows pending,
// the attempt not counted) instead of replying; without a newer message,
// or after the run started a write, it replies.
func TestFinalizeTurnHandsATurnBackForANewerMessage(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	p := schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-1", Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	c, _, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	b.send(t, "c", "m2", "two")
	out, err := schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-1", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "partial", SupersedeIfNewer: true})
	require.NoError(t, err)
	require.True(t, out.Superseded)
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`), "no reply to part of the burst")
	require.Equal(t, []string{"pending", "pending"}, b.statuses(t, "c"))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_outbox WHERE attempts <> 0`), "a superseded turn is not an attempt")

	p.RunID = "run-2"
	c, in, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"one", "two"}, contents(in.Messages), "the next turn answers both")
	b.operation(t, "c", "run-2", "write", "completed")
	b.send(t, "c", "m3", "three")
	out, err = schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "both", SupersedeIfNewer: true})
	require.NoError(t, err)
	require.False(t, out.Superseded, "a run that started a write keeps its reply")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))
}

// TestClaimTurnNeverTakesRowsAnotherRunFinishedWhileItWaited: a claim
// whose statement began while another run claimed and finished the same
// rows waits for that run's lock, and then must find the rows done, not
// pending as its snapshot had them: no row is answered twice.
func TestClaimTurnNeverTakesRowsAnotherRunFinishedWhileItWaited(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")

	// Run A claims in a transaction and holds the conversation's lock.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	a, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-a", Worker: "a", Lease: time.Minute, MaxAttempts: 3})
	require.NoError(t, err)
	require.Len(t, a.OutboxIDs, 1)

	// Run B's claim starts now (its snapshot still shows the row pending)
	// and waits for the lock.
	type result struct {
		c   schema.Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, _, err := schema.ClaimTurn(ctx, b.db.Pool, schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-b", Worker: "b", Lease: time.Minute, MaxAttempts: 3}, 10)
		done <- result{c, err}
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testenv.Count(t, b.db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%c.id = ANY($1) ORDER BY c.id FOR UPDATE%'`) > 0
	}, "run B's claim to wait for the lock")
	// A finishes its turn and commits: the conversation is free again.
	_, err = schema.FinalizeTx(ctx, tx, schema.Finalize{ConversationID: b.key("c"), RunID: "run-a", TurnID: a.TurnID, OutboxIDs: a.OutboxIDs, Content: "answer"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.True(t, r.c.Empty(), "the row A answered is not claimed again: %+v", r.c)
	require.Equal(t, []string{"done"}, b.statuses(t, "c"))
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`))
}
