package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func (b turnBundle) stop(t *testing.T, conversationID string) schema.Stop {
	t.Helper()
	var s schema.Stop
	require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		s, err = schema.StopTx(context.Background(), tx, b.owner, conversationID)
		return err
	}))
	return s
}

// TestAStopSettlesWaitingMessagesAndEndsTheRunningTurnStopped: the stop
// settles what waits at once, and the running turn, whatever path ends
// it (its finalize with the whole reply, a renewal, a supersede), ends
// stopped with its reply and is never handed back; a message after the
// stop gets a turn of its own.
func TestAStopSettlesWaitingMessagesAndEndsTheRunningTurnStopped(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	p := schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-1", Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	c, _, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	waiting := b.send(t, "c", "m2", "two")

	s := b.stop(t, "c")
	require.Equal(t, "run-1", s.RunID, "the run that holds the conversation is asked to stop")
	require.Equal(t, []int64{waiting}, s.SettledIDs, "the waiting message is settled at once")
	require.Equal(t, []string{"processing", "done"}, b.statuses(t, "c"))

	_, err = schema.RenewLease(ctx, b.db.Pool, b.key("c"), "run-1", time.Minute)
	require.ErrorIs(t, err, schema.ErrStopRequested, "a worker that missed the notice learns of the stop at its renewal")
	var superseded bool
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		superseded, err = schema.SupersedeTx(ctx, tx, b.key("c"), "run-1", c.OutboxIDs, false)
		return err
	})
	require.ErrorIs(t, err, schema.ErrStopRequested, "a stopped run is never handed back")
	require.False(t, superseded)

	// The model finished as the stop came: the finalize sees the stop and
	// never supersedes, whatever the worker asked.
	out, err := schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-1", TurnID: c.TurnID,
		OutboxIDs: c.OutboxIDs, Content: "partial", SupersedeIfNewer: true})
	require.NoError(t, err)
	require.True(t, out.Stopped, "a run asked to stop ends stopped")
	require.Equal(t, c.ReplyID(), out.MessageID)
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant' AND stopped AND content = 'partial'`), "the partial reply is kept, marked stopped")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM agent_runs WHERE id = 'run-1' AND status = 'finalized' AND reply_message_id = $1`, out.MessageID),
		"the run is finalized with its stopped reply")

	b.send(t, "c", "m3", "three")
	p.RunID = "run-2"
	c2, in, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"three"}, contents(in.Messages), "a message after the stop starts a new turn, alone")
	out, err = schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c2.TurnID, OutboxIDs: c2.OutboxIDs, Content: "answer"})
	require.NoError(t, err)
	require.False(t, out.Stopped, "the stop was for the run it named, not the next")

	msgs, _, err := schema.ListMessages(ctx, b.db.Pool, b.owner, "c", "", 10)
	require.NoError(t, err)
	require.Len(t, msgs, 5)
	require.Equal(t, "stopped", *msgs[1].Status, "the settled message says it was stopped")
	require.True(t, msgs[2].Stopped)

	s = b.stop(t, "c")
	require.Empty(t, s.RunID, "nothing runs: nothing to stop")
	require.Empty(t, s.SettledIDs)
	require.Equal(t, 5, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages`), "a stop of nothing writes nothing")
}

// TestRecoveryOfAStoppedRunSettlesItStoppedAndNeverRetries: a worker that
// died after the stop leaves nothing to recover but the stop, even after a
// started write.
func TestRecoveryOfAStoppedRunSettlesItStoppedAndNeverRetries(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	for _, conv := range []string{"quiet", "wrote"} {
		b.conversation(t, conv)
		b.send(t, conv, conv+"-m", "hi")
		b.expire(t, conv, conv+"-run")
		b.stop(t, conv)
	}
	b.operation(t, "wrote", "wrote-run", "write", "started")
	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		recs, err = schema.RecoverExpiredTx(ctx, tx, 100, 3)
		return err
	}))
	require.Len(t, recs, 2)
	for _, r := range recs {
		require.Equal(t, schema.RecoveryStopped, r.Outcome, r.RunID)
		require.Empty(t, r.RetryIDs, "a stopped run is never retried")
		require.NotEmpty(t, r.ReplyID)
	}
	for _, conv := range []string{"quiet", "wrote"} {
		require.Equal(t, []string{"done"}, b.statuses(t, conv), conv)
	}
	require.Equal(t, 2, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant' AND stopped`))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE role = 'error'`), "a stop is no failure")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE message_id IS NOT NULL`), "the write is attached to the stopped reply")
}

// TestRegenerateAnswersTheNewestTurnAgainWithAReplyOfItsOwn: the rows go
// back with one more generation, the new turn's reply has a new id, the
// old one is kept and marked superseded, and a second regenerate gets a
// third id. It is refused while a turn runs and for an older turn.
func TestRegenerateAnswersTheNewestTurnAgainWithAReplyOfItsOwn(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	regenerate := func(g schema.Regenerate) (schema.Regenerated, error) {
		g.OwnerID, g.ConversationID = b.owner, "c"
		var out schema.Regenerated
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			out, err = schema.RegenerateTx(ctx, tx, g)
			return err
		})
		return out, err
	}
	p := schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-1", Worker: "w", Lease: time.Minute, MaxAttempts: 3}
	c1, _, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	_, err = regenerate(schema.Regenerate{MessageID: "m1"})
	require.ErrorIs(t, err, schema.ErrTurnRunning, "refused while a turn runs")
	first, err := schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-1", TurnID: c1.TurnID, OutboxIDs: c1.OutboxIDs, Content: "first"})
	require.NoError(t, err)

	_, err = regenerate(schema.Regenerate{MessageID: "m1", ReplyID: "reply_other"})
	require.ErrorIs(t, err, schema.ErrNotNewest, "a reply that is not the message's")
	g, err := regenerate(schema.Regenerate{MessageID: "m1", ReplyID: first.MessageID})
	require.NoError(t, err)
	require.Equal(t, c1.OutboxIDs, g.OutboxIDs)
	require.Equal(t, 1, g.Generation)
	require.Equal(t, first.MessageID, g.Superseded)
	require.Equal(t, []string{"pending"}, b.statuses(t, "c"))

	p.RunID = "run-2"
	c2, in, err := schema.ClaimTurn(ctx, b.db.Pool, p, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"one"}, contents(in.Messages), "the same input again")
	require.NotContains(t, contents(in.History), "first", "the superseded reply is no context of its own turn")
	require.NotEqual(t, c1.TurnID, c2.TurnID, "a turn of its own")
	require.Equal(t, b.turnID(t, "c", c1.OutboxIDs, 1), c2.TurnID, "the claim derives the turn id as TurnIDs does")
	second, err := schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c2.TurnID,
		OutboxIDs: c2.OutboxIDs, Generation: c2.Generation, Content: "second"})
	require.NoError(t, err)
	require.NotEqual(t, first.MessageID, second.MessageID, "the new reply has an id of its own")

	hist, next, err := schema.ChatHistory(ctx, b.db.Pool, b.owner, "c", "", 10)
	require.NoError(t, err)
	require.Empty(t, next)
	require.Len(t, hist, 2, "the history shows the new reply in place of the old")
	require.Equal(t, second.MessageID, hist[1].ID)
	require.Equal(t, "second", hist[1].Content)
	msgs, _, err := schema.ListMessages(ctx, b.db.Pool, b.owner, "c", "", 10)
	require.NoError(t, err)
	require.Len(t, msgs, 3, "the old reply is kept")
	require.True(t, msgs[1].Superseded)

	b.send(t, "c", "m2", "two")
	_, err = regenerate(schema.Regenerate{MessageID: "m1"})
	require.ErrorIs(t, err, schema.ErrTurnRunning, "a waiting message is a turn about to run")
}

// TestHistoryPagesFromTheNewestWithEachReplysToolCalls: pages go back in
// time, each oldest first, and a reply carries the tool calls its run
// journaled.
func TestHistoryPagesFromTheNewestWithEachReplysToolCalls(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	for i, m := range []string{"one", "two", "three"} {
		b.send(t, "c", m, m)
		run := "run-" + m
		c, _, err := schema.ClaimTurn(ctx, b.db.Pool, schema.ClaimParams{ConversationID: b.key("c"), RunID: run, Worker: "w", Lease: time.Minute, MaxAttempts: 3}, 10)
		require.NoError(t, err)
		if i == 2 {
			_, err = b.db.Pool.Exec(ctx, `
				INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, effect, status, arguments, result)
				VALUES ($1, $2, 'call_1', 'lookup', 'read', 'completed', '{"text":"x"}', 'found')`, run, b.key("c"))
			require.NoError(t, err)
		}
		_, err = schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: run, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Content: "re " + m})
		require.NoError(t, err)
	}
	newest, next, err := schema.ChatHistory(ctx, b.db.Pool, b.owner, "c", "", 4)
	require.NoError(t, err)
	require.NotEmpty(t, next)
	require.Equal(t, []string{"two", "re two", "three", "re three"}, chatContents(newest))
	require.Len(t, newest[3].Tools, 1)
	require.Equal(t, schema.ChatTool{CallID: "call_1", Tool: "lookup", Input: []byte(`{"text": "x"}`), Status: "completed", Output: "found"}, newest[3].Tools[0])
	older, next, err := schema.ChatHistory(ctx, b.db.Pool, b.owner, "c", next, 4)
	require.NoError(t, err)
	require.Empty(t, next)
	require.Equal(t, []string{"one", "re one"}, chatContents(older))

	_, _, err = schema.ChatHistory(ctx, b.db.Pool, b.owner+1, "c", "", 4)
	require.ErrorIs(t, err, schema.ErrNotFound, "another owner's chat")
}

func chatContents(ms []schema.ChatMessage) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Content
	}
	return out
}

// park has run claim conversationID's pending rows and stop at a write
// that needs approval, as a worker does; it returns the claim and the
// approval.
func (b turnBundle) park(t *testing.T, conversationID, runID string) (schema.Claim, schema.Requested) {
	t.Helper()
	ctx := context.Background()
	var c schema.Claim
	var req schema.Requested
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		c, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: b.key(conversationID), RunID: runID, Worker: "test", Lease: time.Minute, MaxAttempts: 3})
		if err != nil {
			return err
		}
		req, err = schema.RequestApprovalTx(ctx, tx, b.approvalRequest(c, runID))
		return err
	}))
	return c, req
}

func (b turnBundle) approvalRequest(c schema.Claim, runID string) schema.ApprovalRequest {
	return schema.ApprovalRequest{
		ConversationID: c.ConversationID, RunID: runID, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs,
		Operation: schema.Operation{RunID: runID, ConversationID: c.ConversationID, ToolCallID: "call_" + runID, Tool: "mail__send",
			ToolVersion: "1", Effect: schema.EffectWrite, IdempotencyKey: "key_" + runID, Arguments: `{"to": "bob"}`, DefinitionSHA256: "def"},
		State: []byte(`{}`), TTL: time.Hour,
	}
}

func (b turnBundle) decide(t *testing.T, conversationID, approvalID string, approved bool) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		_, err := schema.DecideApprovalTx(context.Background(), tx, b.owner, conversationID, approvalID, schema.Decision{Approved: approved, UserID: b.owner})
		return err
	})
}

func (b turnBundle) regenerate(t *testing.T, conversationID, messageID string) (schema.Regenerated, error) {
	t.Helper()
	var out schema.Regenerated
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.RegenerateTx(context.Background(), tx, schema.Regenerate{OwnerID: b.owner, ConversationID: conversationID, MessageID: messageID})
		return err
	})
	return out, err
}

// TestAStopWhileATurnWaitsForApprovalDeniesItAndNothingOfItRunsLater: the
// turn holds no run, so the stop settles it: the approval is denied, its
// call recorded as never sent, the turn's messages settled; the approval
// cannot be decided afterwards, and neither a new message nor a
// regenerate resumes the old turn. A regenerate while the approval waits
// is refused.
func TestAStopWhileATurnWaitsForApprovalDeniesItAndNothingOfItRunsLater(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	row := b.send(t, "c", "m1", "one")
	_, req := b.park(t, "c", "run-1")

	_, err := b.regenerate(t, "c", "m1")
	require.ErrorIs(t, err, schema.ErrTurnRunning, "a turn that waits for approval is a turn that runs: no regenerate")

	s := b.stop(t, "c")
	require.Empty(t, s.RunID, "no run holds a turn that waits for approval")
	require.Equal(t, []int64{row}, s.SettledIDs, "the waiting turn's message is settled")
	require.NotNil(t, s.Approval, "the stop names the approval it settled")
	require.Equal(t, req.ApprovalID, s.Approval.ID)
	require.Equal(t, schema.ApprovalDenied, s.Approval.Status)
	require.True(t, s.Denied, "the stop denied it")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM approvals WHERE public_id = $1 AND status = 'denied' AND decided_by = $2`, req.ApprovalID, b.owner),
		"the approval is denied, by the user who stopped")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE id = $1 AND status = 'denied' AND error = 'not sent: the turn was stopped'`, req.OperationID),
		"the call is recorded as never sent")
	require.ErrorIs(t, b.decide(t, "c", req.ApprovalID, true), schema.ErrApprovalDecided, "a stopped turn's approval cannot be given afterwards")

	// A regenerate after the stop is a new turn of the same message, not
	// the stopped one resumed.
	g, err := b.regenerate(t, "c", "m1")
	require.NoError(t, err)
	require.Equal(t, []int64{row}, g.OutboxIDs)
	c2, in, err := schema.ClaimTurn(ctx, b.db.Pool, schema.ClaimParams{ConversationID: b.key("c"), RunID: "run-2", Worker: "w", Lease: time.Minute, MaxAttempts: 3}, 10)
	require.NoError(t, err, "nothing waits any more")
	require.Nil(t, c2.Resume, "the stopped turn is never resumed")
	require.Equal(t, b.turnID(t, "c", []int64{row}, 1), c2.TurnID)
	require.Equal(t, []string{"one"}, contents(in.Messages))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM conversations WHERE id = $1 AND approval_id IS NOT NULL`, b.key("c")), "the claim forgot the approval")
	_, err = schema.FinalizeTurn(ctx, b.db.Pool, schema.Finalize{ConversationID: b.key("c"), RunID: "run-2", TurnID: c2.TurnID, OutboxIDs: c2.OutboxIDs,
		Generation: c2.Generation, Content: "answer"})
	require.NoError(t, err)
	require.Equal(t, 0, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE id = $1 AND status <> 'denied'`, req.OperationID), "the call was never sent")

	// The same with a new message instead of a regenerate.
	b.conversation(t, "d")
	b.send(t, "d", "d-m1", "one")
	_, req = b.park(t, "d", "run-d1")
	require.NoError(t, b.decide(t, "d", req.ApprovalID, true), "approved, and stopped before any worker resumed it")
	s = b.stop(t, "d")
	require.Equal(t, schema.ApprovalApproved, s.Approval.Status, "a decided approval keeps its decision")
	require.False(t, s.Denied)
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE id = $1 AND status = 'denied'`, req.OperationID), "its call is never sent")
	b.send(t, "d", "d-m2", "two")
	c3, in, err := schema.ClaimTurn(ctx, b.db.Pool, schema.ClaimParams{ConversationID: b.key("d"), RunID: "run-d2", Worker: "w", Lease: time.Minute, MaxAttempts: 3}, 10)
	require.NoError(t, err)
	require.Nil(t, c3.Resume, "the stopped turn is never resumed")
	require.Equal(t, []string{"two"}, contents(in.Messages), "the message after the stop starts a turn of its own")
}

// TestARunAskedToStopDoesNotWaitForAnApproval: a stop that came before the
// run asked for approval wins; nothing of the call is written.
func TestARunAskedToStopDoesNotWaitForAnApproval(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "run-1", b.stop(t, "c").RunID)
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := schema.RequestApprovalTx(ctx, tx, b.approvalRequest(c, "run-1"))
		return err
	})
	require.ErrorIs(t, err, schema.ErrStopRequested, "the run ends stopped instead of waiting")
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM approvals`))
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations`))
}

// TestATurnResumedFromAnApprovalKeepsItsGenerationAndReplyID: a
// regenerated turn that stops for approval resumes as the same turn (its
// rows at the same generation), so its reply has the id its streams were
// told at the start; stopped while it runs and its worker's session gone,
// the recovery ends it stopped with that reply, carrying the call that
// was never sent.
func TestATurnResumedFromAnApprovalKeepsItsGenerationAndReplyID(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.trustSessions(t, time.Minute)
	b.conversation(t, "c")
	b.send(t, "c", "m1", "one")
	c1, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	_, err = b.finalize(t, c1, "run-1")
	require.NoError(t, err)
	_, err = b.regenerate(t, "c", "m1")
	require.NoError(t, err)

	c2, req := b.park(t, "c", "run-2")
	require.Equal(t, 1, c2.Generation)
	require.NoError(t, b.decide(t, "c", req.ApprovalID, true))
	session := b.takeSession(t)
	c3, err := b.claimAs(t, "c", "run-3", session.id)
	require.NoError(t, err)
	require.NotNil(t, c3.Resume, "the decided approval resumes the turn")
	require.Equal(t, c2.TurnID, c3.TurnID, "the same turn: its rows at the same generation")
	require.Equal(t, c2.ReplyID(), c3.ReplyID(), "the reply keeps the id its streams were told")

	require.Equal(t, "run-3", b.stop(t, "c").RunID, "the resumed run holds the conversation and is asked to stop")
	var ended bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, session.conn.PgConn().PID()).Scan(&ended))
	require.True(t, ended)
	c4, err := b.claimAs(t, "c", "run-4", 0)
	require.NoError(t, err)
	require.NotNil(t, c4.Recovered, "the gone worker's run is recovered at once")
	require.Equal(t, schema.RecoveryStopped, c4.Recovered.Outcome, "a stopped run is settled stopped, never retried")
	require.Equal(t, c2.ReplyID(), c4.Recovered.ReplyID)
	require.True(t, c4.Empty(), "nothing is left to answer")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE id = $1 AND status = 'denied' AND message_id = $2`, req.OperationID, c2.ReplyID()),
		"the call that was never sent is settled and shown with the stopped reply")
	require.Zero(t, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM conversations WHERE id = $1 AND (approval_id IS NOT NULL OR run_id IS NOT NULL)`, b.key("c")))
}
