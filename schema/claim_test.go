package schema_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

type turnBundle struct {
	db    *testenv.DB
	owner int64
	// keys maps the conversations' ids to their keys.
	keys map[string]string
}

func setupTurns(t *testing.T) turnBundle {
	t.Helper()
	db := testenv.Database(t)
	_, u, err := schema.CreateToken(context.Background(), db.Pool, "turns")
	require.NoError(t, err)
	return turnBundle{db: db, owner: u.ID, keys: map[string]string{}}
}

func (b turnBundle) conversation(t *testing.T, id string) {
	t.Helper()
	c, _, err := schema.CreateConversation(context.Background(), b.db.Pool, b.owner, id, "")
	require.NoError(t, err)
	b.keys[id] = c.Key
}

// key is the key of a conversation created by conversation.
func (b turnBundle) key(id string) string { return b.keys[id] }

// turnID is the id a claim derives for a turn over rows of a conversation
// at a generation.
func (b turnBundle) turnID(t *testing.T, conversationID string, ids []int64, generation int) string {
	t.Helper()
	turnID, _, err := schema.TurnIDs(context.Background(), b.db.Pool, b.key(conversationID), ids, generation)
	require.NoError(t, err)
	return turnID
}

func (b turnBundle) send(t *testing.T, conversationID, messageID, content string) int64 {
	t.Helper()
	var res schema.InsertResult
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = schema.InsertMessageTx(context.Background(), tx, schema.UserMessage{OwnerID: b.owner, ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	})
	require.NoError(t, err)
	return res.OutboxID
}

func (b turnBundle) claim(t *testing.T, conversationID, runID string, lease time.Duration) (schema.Claim, error) {
	t.Helper()
	var c schema.Claim
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		c, err = schema.ClaimTx(context.Background(), tx, schema.ClaimParams{ConversationID: b.key(conversationID), RunID: runID, Worker: "test", Lease: lease, MaxAttempts: 3})
		return err
	})
	return c, err
}

func (b turnBundle) finalize(t *testing.T, c schema.Claim, runID string) (schema.Finalized, error) {
	t.Helper()
	var out schema.Finalized
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.FinalizeTx(context.Background(), tx, schema.Finalize{ConversationID: c.ConversationID, RunID: runID, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "answer"})
		return err
	})
	return out, err
}

func (b turnBundle) statuses(t *testing.T, conversationID string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT status FROM agent_outbox WHERE conversation_id = $1 ORDER BY id`, b.key(conversationID))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func TestTurnIDDependsOnlyOnTheSetOfRows(t *testing.T) {
	t.Parallel()
	require.Equal(t, schema.TurnID([]int64{3, 1, 2}), schema.TurnID([]int64{1, 2, 3}))
	require.NotEqual(t, schema.TurnID([]int64{1, 2}), schema.TurnID([]int64{1, 2, 3}))
	require.NotEqual(t, schema.TurnID([]int64{12}), schema.TurnID([]int64{1, 2}))
}

func TestClaimTakesExactlyThePendingRowsAndTheLease(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	id1 := b.send(t, "c", "m1", "one")
	id2 := b.send(t, "c", "m2", "two")

	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, []int64{id1, id2}, c.OutboxIDs, "the claim returns the exact rows of the turn")
	require.Equal(t, b.turnID(t, "c", []int64{id1, id2}, 0), c.TurnID)
	require.Equal(t, 1, c.Attempts)
	require.Equal(t, []string{"processing", "processing"}, b.statuses(t, "c"))

	// A row that arrives during the turn is the next turn's, and the
	// conversation is not free for it yet.
	id3 := b.send(t, "c", "m3", "three")
	_, err = b.claim(t, "c", "run-2", time.Minute)
	require.ErrorIs(t, err, schema.ErrConversationBusy, "a live lease keeps a second run out")

	in, err := schema.LoadTurn(ctx, b.db.Pool, b.key("c"), c.OutboxIDs, 10)
	require.NoError(t, err)
	require.Len(t, in.Messages, 2, "content is loaded for the claimed rows only")
	require.Equal(t, "one", in.Messages[0].Content)

	out, err := b.finalize(t, c, "run-1")
	require.NoError(t, err)
	require.Equal(t, c.ReplyID(), out.MessageID)
	require.Equal(t, []string{"done", "done", "pending"}, b.statuses(t, "c"))

	var runID *string
	var unread int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT run_id, unread_count FROM conversations WHERE id = $1`, b.key("c")).Scan(&runID, &unread))
	require.Nil(t, runID, "finalize releases the conversation")
	require.Equal(t, 1, unread, "finalize counts the reply as unread")

	c2, err := b.claim(t, "c", "run-2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, []int64{id3}, c2.OutboxIDs)
	in, err = schema.LoadTurn(ctx, b.db.Pool, b.key("c"), c2.OutboxIDs, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"one", "two", "answer"}, contents(in.History), "history is what came before the turn")

	empty, err := b.claim(t, "no-such-conversation", "run-3", time.Minute)
	require.ErrorIs(t, err, schema.ErrConversationDeleted, "an unknown conversation is reported as deleted")
	require.True(t, empty.Empty())
}

func contents(ms []schema.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Content)
	}
	return out
}

func TestFinalizeIsFencedByTheRun(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)

	_, err = b.finalize(t, c, "run-intruder")
	require.ErrorIs(t, err, schema.ErrLeaseLost, "a run that does not own the conversation must not finalize")

	// The lease expires and recovery hands the rows back: the late
	// finalize of the first run must not commit.
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.key("c"))
	require.NoError(t, err)
	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		recs, err = schema.RecoverExpiredTx(ctx, tx, 10, 3)
		return err
	}))
	require.Len(t, recs, 1)
	require.Equal(t, schema.RecoveryRetry, recs[0].Outcome)
	_, err = b.finalize(t, c, "run-1")
	require.ErrorIs(t, err, schema.ErrLeaseLost)
	var replies int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM messages WHERE role = 'assistant'`).Scan(&replies))
	require.Zero(t, replies, "a fenced finalize commits nothing")
	require.Equal(t, []string{"pending"}, b.statuses(t, "c"))
}

func TestFinalizeOfADeletedConversationIsACancellation(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	_, err = schema.DeleteConversation(ctx, b.db.Pool, b.owner, "c")
	require.NoError(t, err)
	_, err = b.finalize(t, c, "run-1")
	require.ErrorIs(t, err, schema.ErrConversationDeleted)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM conversations`).Scan(&n))
	require.Zero(t, n, "nothing is recreated")
}

func TestFailedAttemptsRetryUnderTheCapThenFailVisibly(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	for attempt := 1; attempt <= 3; attempt++ {
		run := fmt.Sprintf("run-%d", attempt)
		c, err := b.claim(t, "c", run, time.Minute)
		require.NoError(t, err)
		require.Equal(t, attempt, c.Attempts)
		var out schema.FailOutcome
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			out, err = schema.FailAttemptTx(ctx, tx, schema.Failure{ConversationID: b.key("c"), RunID: run, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Reason: "model down", MaxAttempts: 3})
			return err
		}))
		if attempt < 3 {
			require.False(t, out.GaveUp)
			require.Equal(t, c.OutboxIDs, out.RetryIDs)
			require.Equal(t, []string{"pending"}, b.statuses(t, "c"))
			continue
		}
		require.True(t, out.GaveUp, "the third failure reaches the cap")
		require.Equal(t, []string{"error"}, b.statuses(t, "c"))
	}
	var role, content, detail string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT role, content, detail FROM messages WHERE role <> 'user'`).Scan(&role, &content, &detail))
	require.Equal(t, schema.RoleError, role)
	require.Contains(t, detail, "model down", "the error's detail says why, for the operator")
	require.NotContains(t, content, "model down", "the user reads a short message, not the cause")
	require.Contains(t, content, "(Reference: run-3)", "the user's message names the run an operator can look up")
}

// expire claims the conversation for run and lets its lease expire.
func (b turnBundle) expire(t *testing.T, conversationID, runID string) schema.Claim {
	t.Helper()
	c, err := b.claim(t, conversationID, runID, time.Minute)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE conversations SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.key(conversationID))
	require.NoError(t, err)
	return c
}

func (b turnBundle) operation(t *testing.T, conversationID, runID, effect, status string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, effect, status)
		VALUES ($1, $2, gen_random_uuid()::text, $3, $4, $5)`, runID, b.key(conversationID), effect+"-tool", effect, status)
	require.NoError(t, err)
}

func TestRecoveryAppliesTheRuleOfOperations(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	cases := []struct {
		name    string
		ops     [][2]string // effect, status
		outcome string
		status  string
	}{
		{"no operation", nil, schema.RecoveryRetry, "pending"},
		{"completed read", [][2]string{{"read", "completed"}}, schema.RecoveryRetry, "pending"},
		{"started read", [][2]string{{"read", "started"}}, schema.RecoveryRetry, "pending"},
		{"completed write", [][2]string{{"read", "completed"}, {"write", "completed"}}, schema.RecoveryFailed, "error"},
		{"started write", [][2]string{{"write", "started"}}, schema.RecoveryFailed, "error"},
	}
	for i, tc := range cases {
		conv := fmt.Sprintf("c%d", i)
		b.conversation(t, conv)
		b.send(t, conv, conv+"-m", "hi")
		b.expire(t, conv, conv+"-run")
		for _, op := range tc.ops {
			b.operation(t, conv, conv+"-run", op[0], op[1])
		}
	}
	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		recs, err = schema.RecoverExpiredTx(ctx, tx, 100, 3)
		return err
	}))
	require.Len(t, recs, len(cases))
	byConv := map[string]schema.Recovery{}
	for _, r := range recs {
		byConv[r.ConversationID] = r
	}
	for i, tc := range cases {
		conv := fmt.Sprintf("c%d", i)
		require.Equal(t, tc.outcome, byConv[b.key(conv)].Outcome, tc.name)
		require.Equal(t, []string{tc.status}, b.statuses(t, conv), tc.name)
		var errors int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'error'`, b.key(conv)).Scan(&errors))
		if tc.outcome == schema.RecoveryFailed {
			require.Equal(t, 1, errors, "%s: a started write fails visibly", tc.name)
		} else {
			require.Zero(t, errors, tc.name)
		}
	}
}

func TestClaimRecoversAnExpiredOwnerInline(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	id := b.send(t, "c", "m1", "one")
	b.expire(t, "c", "dead-run")
	c, err := b.claim(t, "c", "run-2", time.Minute)
	require.NoError(t, err)
	require.NotNil(t, c.Recovered)
	require.Equal(t, schema.RecoveryRetry, c.Recovered.Outcome)
	require.Equal(t, []int64{id}, c.OutboxIDs)
	require.Equal(t, 2, c.Attempts, "the interrupted attempt counts")
	var status string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status FROM agent_runs WHERE id = 'dead-run'`).Scan(&status))
	require.Equal(t, "recovered", status)
}

func TestRecoveryAtTheAttemptCapFailsVisibly(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	for i := range 3 {
		b.expire(t, "c", fmt.Sprintf("run-%d", i))
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := schema.RecoverExpiredTx(ctx, tx, 10, 3)
			return err
		}))
	}
	require.Equal(t, []string{"error"}, b.statuses(t, "c"), "a turn that kills its worker every time must end")
}

func TestRenewLeaseReportsLossAndDeletion(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Second)
	require.NoError(t, err)
	until, err := schema.RenewLease(ctx, b.db.Pool, b.key("c"), "run-1", time.Minute)
	require.NoError(t, err)
	require.True(t, until.After(c.LeaseExpiresAt.Add(30*time.Second)))
	_, err = schema.RenewLease(ctx, b.db.Pool, b.key("c"), "run-other", time.Minute)
	require.ErrorIs(t, err, schema.ErrLeaseLost)
	_, err = schema.DeleteConversation(ctx, b.db.Pool, b.owner, "c")
	require.NoError(t, err)
	_, err = schema.RenewLease(ctx, b.db.Pool, b.key("c"), "run-1", time.Minute)
	require.ErrorIs(t, err, schema.ErrConversationDeleted)
}

// TestClaimTxThatWaitedForAProducerClaimsItsRow: a claim that starts while
// a producer's transaction holds the conversation (its message inserted,
// not yet committed) waits for it, and then claims that message's row,
// although the statement that waited has a snapshot older than the commit.
func TestClaimTxThatWaitedForAProducerClaimsItsRow(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	producer, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer producer.Rollback(ctx)
	sent, err := schema.InsertMessageTx(ctx, producer, schema.UserMessage{OwnerID: b.owner, ConversationID: "c", MessageID: "m1", Content: "one"})
	require.NoError(t, err)

	type result struct {
		c   schema.Claim
		err error
	}
	claimed := make(chan result, 1)
	go func() {
		c, err := b.claim(t, "c", "run-1", time.Minute)
		claimed <- result{c, err}
	}()
	b.eventuallyWaitsForLock(t, "the claim waits for the producer's transaction")
	require.NoError(t, producer.Commit(ctx))
	r := <-claimed
	require.NoError(t, r.err)
	require.Equal(t, []int64{sent.OutboxID}, r.c.OutboxIDs, "the claim takes the row whose commit it waited for")
	require.Equal(t, []string{"processing"}, b.statuses(t, "c"))
}

// TestFinalizeTxHandsATurnBackForANewerMessage: in the caller's
// transaction, with SupersedeIfNewer, a newer pending message makes
// FinalizeTx hand the turn back (rows pending, no reply, the run
// superseded); without one, it replies.
func TestFinalizeTxHandsATurnBackForANewerMessage(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	b.send(t, "c", "m2", "two")
	finalize := func(c schema.Claim) (schema.Finalized, error) {
		var out schema.Finalized
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			out, err = schema.FinalizeTx(ctx, tx, schema.Finalize{ConversationID: c.ConversationID, RunID: c.RunID, TurnID: c.TurnID,
				OutboxIDs: c.OutboxIDs, Content: "answer", SupersedeIfNewer: true})
			return err
		})
		return out, err
	}
	out, err := finalize(c)
	require.NoError(t, err)
	require.True(t, out.Superseded, "a newer message hands the turn back")
	require.Equal(t, []string{"pending", "pending"}, b.statuses(t, "c"))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`), "no reply to part of the burst")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id = 'run-1' AND status = 'superseded'`))

	c, err = b.claim(t, "c", "run-2", time.Minute)
	require.NoError(t, err)
	require.Len(t, c.OutboxIDs, 2, "the next turn answers both")
	out, err = finalize(c)
	require.NoError(t, err)
	require.False(t, out.Superseded, "without a newer message the turn replies")
	require.Equal(t, c.ReplyID(), out.MessageID)
	require.Equal(t, []string{"done", "done"}, b.statuses(t, "c"))
}
