package schema_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// conversationWith creates a conversation of the bundle's owner with a
// double texting policy.
func (b turnBundle) conversationWith(t *testing.T, id string, policy schema.DoubleTexting) {
	t.Helper()
	c, created, err := schema.CreateConversationWith(context.Background(), b.db.Pool, b.owner, schema.NewConversation{ID: id, DoubleTexting: policy})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, policy, c.DoubleTexting)
	b.keys[id] = c.Key
}

// sendResult stores a message as send does and returns what the producer
// said, or its error.
func (b turnBundle) sendResult(t *testing.T, conversationID, messageID, content string) (schema.InsertResult, error) {
	t.Helper()
	var res schema.InsertResult
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = schema.InsertMessageTx(context.Background(), tx, schema.UserMessage{OwnerID: b.owner, ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	})
	return res, err
}

// finalizeWith ends c's turn with content, as a worker ends it.
func (b turnBundle) finalizeWith(t *testing.T, c schema.Claim, content string, stopped bool) schema.Finalized {
	t.Helper()
	out, err := schema.FinalizeTurn(context.Background(), b.db.Pool, schema.Finalize{ConversationID: c.ConversationID, RunID: c.RunID,
		TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Generation: c.Generation, Content: content, Stopped: stopped})
	require.NoError(t, err)
	return out
}

func (b turnBundle) claimTurn(t *testing.T, conversationID, runID string) (schema.Claim, schema.TurnInput) {
	t.Helper()
	c, in, err := schema.ClaimTurn(context.Background(), b.db.Pool,
		schema.ClaimParams{ConversationID: b.key(conversationID), RunID: runID, Worker: "w", Lease: time.Minute, MaxAttempts: 3}, 10)
	require.NoError(t, err)
	return c, in
}

// TestTheDoubleTextingOfAConversationIsSetAtCreationAndChangedByItsOwner:
// the default is debounce; a policy given at creation is stored, one
// that is none creates nothing; only the owner changes it.
func TestTheDoubleTextingOfAConversationIsSetAtCreationAndChangedByItsOwner(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	c, _, err := schema.CreateConversation(ctx, b.db.Pool, b.owner, "plain", "")
	require.NoError(t, err)
	require.Equal(t, schema.DoubleTextingDebounce, c.DoubleTexting, "a conversation made without a policy debounces")

	b.conversationWith(t, "queue", schema.DoubleTextingEnqueue)
	_, _, err = schema.CreateConversationWith(ctx, b.db.Pool, b.owner, schema.NewConversation{ID: "queue", DoubleTexting: schema.DoubleTextingReject})
	require.NoError(t, err)
	got, err := schema.GetConversation(ctx, b.db.Pool, b.owner, "queue")
	require.NoError(t, err)
	require.Equal(t, schema.DoubleTextingEnqueue, got.DoubleTexting, "creating it again changes nothing")

	_, _, err = schema.CreateConversationWith(ctx, b.db.Pool, b.owner, schema.NewConversation{ID: "bad", DoubleTexting: "shout"})
	var pe *schema.ProducerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, schema.SQLStateBadDoubleTexting, pe.Code)
	require.ErrorIs(t, err, schema.ErrInvalid)
	require.Equal(t, `double texting "shout" is not a policy: give enqueue, reject, interrupt or debounce`, pe.Message)
	_, err = schema.GetConversation(ctx, b.db.Pool, b.owner, "bad")
	require.ErrorIs(t, err, schema.ErrNotFound, "a refused policy creates nothing")

	set, err := schema.SetDoubleTexting(ctx, b.db.Pool, b.owner, "plain", schema.DoubleTextingInterrupt)
	require.NoError(t, err)
	require.Equal(t, schema.DoubleTextingInterrupt, set.DoubleTexting)
	require.Equal(t, "plain", set.ID)
	_, err = schema.SetDoubleTexting(ctx, b.db.Pool, b.owner+1, "plain", schema.DoubleTextingReject)
	require.ErrorIs(t, err, schema.ErrNotFound, "another owner's conversation is not found")
	_, err = schema.SetDoubleTexting(ctx, b.db.Pool, b.owner, "plain", "shout")
	require.ErrorIs(t, err, schema.ErrInvalid)
	got, err = schema.GetConversation(ctx, b.db.Pool, b.owner, "plain")
	require.NoError(t, err)
	require.Equal(t, schema.DoubleTextingInterrupt, got.DoubleTexting)
}

// TestAConversationThatEnqueuesAnswersOneMessagePerTurnInOrder: two
// messages waiting make two turns, the oldest first, and the second's
// history holds the first one's reply.
func TestAConversationThatEnqueuesAnswersOneMessagePerTurnInOrder(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.conversationWith(t, "c", schema.DoubleTextingEnqueue)
	first := b.send(t, "c", "m1", "one")
	second := b.send(t, "c", "m2", "two")

	c1, in := b.claimTurn(t, "c", "run-1")
	require.Equal(t, []int64{first}, c1.OutboxIDs, "one message per turn")
	require.True(t, c1.More, "the other waits for the next turn")
	require.Equal(t, schema.DoubleTextingEnqueue, c1.DoubleTexting)
	require.Equal(t, []string{"one"}, contents(in.Messages))
	b.finalizeWith(t, c1, "re one", false)

	c2, in := b.claimTurn(t, "c", "run-2")
	require.Equal(t, []int64{second}, c2.OutboxIDs)
	require.False(t, c2.More)
	require.Equal(t, []string{"two"}, contents(in.Messages))
	require.Equal(t, []string{"one", "re one"}, contents(in.History), "the next turn sees the first one answered")

	// A batch of claims caps it the same way.
	b.conversation(t, "d")
	b.send(t, "d", "d1", "one")
	b.send(t, "d", "d2", "two")
	res := schema.ClaimTurns(context.Background(), b.db.Pool, []schema.ClaimParams{
		{ConversationID: b.key("d"), RunID: "run-d", Worker: "w", Lease: time.Minute, MaxAttempts: 3},
	}, 10)
	require.NoError(t, res[0].Err)
	require.Len(t, res[0].Claim.OutboxIDs, 2, "a conversation that debounces takes every waiting message")
	require.Equal(t, schema.DoubleTextingDebounce, res[0].Claim.DoubleTexting)
}

// TestRejectRefusesANewMessageWhileATurnRunsOrWaitsAndWritesNothing: a
// message that waits for a turn, a running turn and a turn that waits
// for an approval each refuse a new message (ErrTurnRunning, PB012),
// which writes nothing; a retry of a stored message is answered as
// always; once the turn ended, the message is stored.
func TestRejectRefusesANewMessageWhileATurnRunsOrWaitsAndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.conversationWith(t, "c", schema.DoubleTextingReject)
	b.send(t, "c", "m1", "one")
	rows := func() int {
		return testenv.Count(t, b.db.Pool, `SELECT (SELECT count(*) FROM messages) + (SELECT count(*) FROM agent_outbox)`)
	}
	before := rows()
	refused := func(messageID, what string) *schema.ProducerError {
		t.Helper()
		_, err := b.sendResult(t, "c", messageID, "new")
		require.ErrorIs(t, err, schema.ErrTurnRunning, what)
		var pe *schema.ProducerError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, schema.SQLStateTurnRunning, pe.Code)
		require.Equal(t, before, rows(), "%s: a refused message writes nothing", what)
		return pe
	}
	pe := refused("m2", "a message waits for a turn")
	require.Equal(t, `conversation "c" has a turn running, and its double texting is reject: send the message once its reply is in, or stop the turn first`, pe.Message)
	res, err := b.sendResult(t, "c", "m1", "one")
	require.NoError(t, err, "a retry of the waiting message is no new message")
	require.True(t, res.Existed)

	c, _ := b.claimTurn(t, "c", "run-1")
	refused("m2", "a turn runs")
	b.finalizeWith(t, c, "re one", false)
	_, err = b.sendResult(t, "c", "m2", "new")
	require.NoError(t, err, "nothing runs: the message is stored")
	before = rows()

	_, req := b.park(t, "c", "run-2")
	pe = refused("m3", "a turn waits for an approval")
	require.Contains(t, pe.Message, `waits for the approval "`+req.ApprovalID+`"`, "the message names the approval")
	require.Equal(t, `conversation "c" waits for the approval "`+req.ApprovalID+`" of its turn, and its double texting is reject: decide the approval or stop the turn, then send the message`, pe.Message)
}

// TestAnInterruptEndsTheRunningTurnStoppedAndAnswersItsMessagesWithTheNewOne:
// the message asks the running run to stop in its own transaction; the
// run's finalize keeps its partial reply, marked stopped and superseded,
// and gives its row back with one more generation; the next turn answers
// both messages, with a reply id of its own, and the partial reply is
// not in its history.
func TestAnInterruptEndsTheRunningTurnStoppedAndAnswersItsMessagesWithTheNewOne(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversationWith(t, "c", schema.DoubleTextingInterrupt)
	b.send(t, "c", "m0", "zero")
	c0, _ := b.claimTurn(t, "c", "run-0")
	b.finalizeWith(t, c0, "re zero", false)

	first := b.send(t, "c", "m1", "one")
	c1, _ := b.claimTurn(t, "c", "run-1")
	res, err := b.sendResult(t, "c", "m2", "two")
	require.NoError(t, err)
	require.Equal(t, "run-1", res.InterruptedRunID, "the message names the run it interrupted, for its stop notice")
	_, err = schema.RenewLease(ctx, b.db.Pool, b.key("c"), "run-1", time.Minute)
	require.ErrorIs(t, err, schema.ErrStopRequested, "the run learns it at its renewal")
	again, err := b.sendResult(t, "c", "m3", "three")
	require.NoError(t, err)
	require.Equal(t, "run-1", again.InterruptedRunID, "a second message while it stops names it again")

	out := b.finalizeWith(t, c1, "partial", true)
	require.True(t, out.Stopped)
	require.True(t, out.Interrupted, "its messages are answered again")
	require.Equal(t, c1.ReplyID(), out.MessageID, "the partial reply keeps the id its streams showed")
	require.Equal(t, []string{"done", "pending", "pending", "pending"}, b.statuses(t, "c"))

	c2, in := b.claimTurn(t, "c", "run-2")
	require.Contains(t, c2.OutboxIDs, first)
	require.Equal(t, []string{"one", "two", "three"}, contents(in.Messages), "one turn answers the interrupted message and the new ones")
	require.Equal(t, []string{"zero", "re zero"}, contents(in.History), "the partial reply is not history")
	require.Equal(t, 1, c2.Generation)
	require.NotEqual(t, c1.ReplyID(), c2.ReplyID(), "the new reply has an id of its own")
	require.Equal(t, schema.DoubleTextingInterrupt, c2.DoubleTexting)
	out = b.finalizeWith(t, c2, "re one two three", false)
	require.False(t, out.Stopped, "the interrupt was for the run it named")

	msgs, _, err := schema.ListMessages(ctx, b.db.Pool, b.owner, "c", "", 20)
	require.NoError(t, err)
	var partial, answer schema.Message
	for _, m := range msgs {
		switch m.Content {
		case "partial":
			partial = m
		case "re one two three":
			answer = m
		}
	}
	require.True(t, partial.Stopped && partial.Superseded, "the partial reply is kept, marked stopped and superseded: %+v", partial)
	require.False(t, answer.Stopped || answer.Superseded)
	require.Equal(t, []string{"done", "done", "done", "done"}, b.statuses(t, "c"))
}

// TestAnInterruptNeverGivesBackATurnThatStartedAWriteOrThatAUserStopped:
// such a turn ends as a stop ends it, its messages settled, and the new
// message is answered alone.
func TestAnInterruptNeverGivesBackATurnThatStartedAWriteOrThatAUserStopped(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	for _, name := range []string{"wrote", "stopped"} {
		b.conversationWith(t, name, schema.DoubleTextingInterrupt)
		b.send(t, name, name+"-1", "one")
		c, _ := b.claimTurn(t, name, name+"-run-1")
		if name == "wrote" {
			b.operation(t, name, name+"-run-1", "write", "completed")
		}
		res, err := b.sendResult(t, name, name+"-2", "two")
		require.NoError(t, err)
		require.Equal(t, name+"-run-1", res.InterruptedRunID)
		if name == "stopped" {
			// The user stops the turn after the interrupt, before it ended:
			// the stop settles the new message too.
			b.stop(t, name)
		}
		out := b.finalizeWith(t, c, "partial", true)
		require.True(t, out.Stopped, name)
		require.False(t, out.Interrupted, "%s: nothing is given back", name)
		want := []string{"done", "pending"}
		if name == "stopped" {
			want = []string{"done", "done"}
		}
		require.Equal(t, want, b.statuses(t, name), "%s: the turn's message is settled", name)
		res, err = b.sendResult(t, name, name+"-3", "three")
		require.NoError(t, err)
		require.Empty(t, res.InterruptedRunID, "nothing runs")
		_, in := b.claimTurn(t, name, name+"-run-2")
		want = []string{"two", "three"}
		if name == "stopped" {
			want = []string{"three"}
		}
		require.Equal(t, want, contents(in.Messages), name)
		require.Contains(t, contents(in.History), "partial", "%s: the stopped reply is history", name)
	}
}

// TestAnInterruptOfATurnThatWaitsForAnApprovalDeniesItAndAnswersBoth: the
// approval is denied as a stop denies it, its call never sent, and the
// next turn answers the waiting turn's message with the new one, without
// resuming the old turn.
func TestAnInterruptOfATurnThatWaitsForAnApprovalDeniesItAndAnswersBoth(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversationWith(t, "c", schema.DoubleTextingInterrupt)
	b.send(t, "c", "m1", "one")
	_, req := b.park(t, "c", "run-1")
	res, err := b.sendResult(t, "c", "m2", "two")
	require.NoError(t, err)
	require.Empty(t, res.InterruptedRunID, "no run holds a turn that waits for an approval")

	as, err := schema.ListApprovals(ctx, b.db.Pool, b.owner, "c", 10)
	require.NoError(t, err)
	require.Len(t, as, 1)
	require.Equal(t, req.ApprovalID, as[0].ID)
	require.Equal(t, schema.ApprovalDenied, as[0].Status, "the approval is denied")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE id = $1 AND status = 'denied'`, req.OperationID), "its call is never sent")
	require.Error(t, b.decide(t, "c", req.ApprovalID, true), "a denied approval cannot be approved any more")

	c2, in := b.claimTurn(t, "c", "run-2")
	require.Nil(t, c2.Resume, "the old turn is not resumed")
	require.Equal(t, []string{"one", "two"}, contents(in.Messages), "one turn answers both")
}

// TestRecoveryOfAnInterruptedRunGivesItsMessagesBack: a worker that died
// after the interrupt leaves a run that recovery ends stopped, with its
// rows given back and announced, to be answered with the new message.
func TestRecoveryOfAnInterruptedRunGivesItsMessagesBack(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversationWith(t, "c", schema.DoubleTextingInterrupt)
	first := b.send(t, "c", "m1", "one")
	b.expire(t, "c", "run-1")
	_, err := b.sendResult(t, "c", "m2", "two")
	require.NoError(t, err)
	var recs []schema.Recovery
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		recs, err = schema.RecoverExpiredTx(ctx, tx, 10, 3)
		return err
	}))
	require.Len(t, recs, 1)
	require.Equal(t, schema.RecoveryStopped, recs[0].Outcome)
	require.Equal(t, []int64{first}, recs[0].RetryIDs, "its row is given back, to be announced")
	_, in := b.claimTurn(t, "c", "run-2")
	require.Equal(t, []string{"one", "two"}, contents(in.Messages))
}

func TestParseDoubleTextingNamesThePolicies(t *testing.T) {
	t.Parallel()
	for _, p := range schema.DoubleTextingPolicies {
		got, err := schema.ParseDoubleTexting(string(p))
		require.NoError(t, err)
		require.Equal(t, p, got)
	}
	_, err := schema.ParseDoubleTexting("Enqueue")
	require.EqualError(t, err, `double texting "Enqueue" is not a policy: give enqueue, reject, interrupt or debounce`)
	require.False(t, errors.Is(err, schema.ErrInvalid))
}
