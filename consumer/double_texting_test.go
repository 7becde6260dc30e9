package consumer

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// policy sets the double texting of the bundle user's conversation.
func (b *bundle) policy(conversationID string, p schema.DoubleTexting) {
	b.T.Helper()
	_, err := schema.SetDoubleTexting(context.Background(), b.DB.Pool, b.Owner, conversationID, p)
	require.NoError(b.T, err)
}

// sendResult commits a message as Send does, and returns what the
// producer said.
func (b *bundle) sendResult(conversationID, messageID, content string) schema.InsertResult {
	b.T.Helper()
	var res schema.InsertResult
	require.NoError(b.T, pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		var err error
		res, err = schema.InsertMessageTx(context.Background(), tx, schema.UserMessage{OwnerID: b.Owner, ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	}))
	return res
}

// answeringAgent writes a reply word by word until stopped (a
// writingAgent) when the turn's newest message is "write" or a tool line;
// any other turn it answers at once with its messages' contents, so that
// a reply says which messages its turn answered.
type answeringAgent struct {
	*writingAgent
}

func (a answeringAgent) Step(ctx context.Context, req StepRequest) (Step, error) {
	last := req.Turn.Messages[len(req.Turn.Messages)-1].Content
	if last == "write" || strings.HasPrefix(last, "/tool ") {
		return a.writingAgent.Step(ctx, req)
	}
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	return Step{Text: "answered: " + strings.Join(messageContents(req.Turn.Messages), "|")}, nil
}

func messageContents(ms []schema.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Content
	}
	return out
}

// replies are the conversation's assistant messages, oldest first.
func (b *bundle) replies(key string) []schema.Message {
	b.T.Helper()
	rows, err := b.DB.Pool.Query(context.Background(), `
		SELECT id, conversation_id, role, content, created_at, seq, stopped, superseded_at IS NOT NULL FROM messages
		WHERE conversation_id = $1 AND role = 'assistant' ORDER BY seq`, key)
	require.NoError(b.T, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (schema.Message, error) {
		var m schema.Message
		err := r.Scan(&m.ID, &m.ConversationID, &m.Role, &m.Content, &m.CreatedAt, &m.Seq, &m.Stopped, &m.Superseded)
		return m, err
	})
	require.NoError(b.T, err)
	return out
}

// TestAConversationThatEnqueuesGetsOneReplyPerMessageInOrder: with a
// quiet window that would make one reply of two quick messages, a
// conversation that enqueues answers each in a turn of its own, in
// order; the second never replaces the running first.
func TestAConversationThatEnqueuesGetsOneReplyPerMessageInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs events
	cfg := b.testConfig()
	cfg.Debounce, cfg.OnConversationEvent = 2*time.Second, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.policy("c", schema.DoubleTextingEnqueue)
	b.Send("c", "m1", "/sleep 300ms\nfirst")
	evs.wait(t, 20*time.Second, key, batonnats.EventProcessing)
	b.Send("c", "m2", "second")
	b.settled(30 * time.Second)

	var got []string
	for _, m := range b.replies(key) {
		got = append(got, m.Content)
	}
	require.Equal(t, []string{"echo: first", "echo: second"}, got, "one reply per message, in order, each answering its own")
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'superseded'`), "the running turn was never replaced")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized' AND cardinality(outbox_ids) = 1`))
}

// TestAnInterruptStopsTheRunningTurnWithWhatItShowedThenOneTurnAnswersBoth:
// the turn's lease is a minute, so only the new message can end it in
// time: through the API's stop notice, or, from a producer that sends
// none (the SQL producer), through its trigger reaching the worker. The
// turn ends stopped with the text it showed, kept (and superseded), and
// one turn answers the interrupted message and the new one.
func TestAnInterruptStopsTheRunningTurnWithWhatItShowedThenOneTurnAnswersBoth(t *testing.T) {
	t.Parallel()
	for _, notice := range []bool{true, false} {
		name := "without a stop notice"
		if notice {
			name = "with the stop notice"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			agent := answeringAgent{newWritingAgent(5 * time.Millisecond)}
			var evs events
			cfg := b.testConfig()
			cfg.Agent, cfg.Lease, cfg.OnConversationEvent = agent, time.Minute, evs.record
			b.startWorker(cfg)
			key := b.Conversation("c")
			b.policy("c", schema.DoubleTextingInterrupt)
			b.Send("c", "m1", "write")
			testenv.WaitFor(t, &agent.signal, 20*time.Second, func() bool { return agent.words() >= 3 }, "the agent to write")
			res := b.sendResult("c", "m2", "two")
			require.NotEmpty(t, res.InterruptedRunID, "the message interrupts the running run")
			if notice {
				require.NoError(t, b.NC.Publish(batonnats.StopSubject(res.ConversationKey, res.InterruptedRunID), nil))
			}
			evs.wait(t, 15*time.Second, key, batonnats.EventReplied)
			b.settled(20 * time.Second)

			agent.mu.Lock()
			cause, shown := agent.causes[res.InterruptedRunID], agent.shown[res.InterruptedRunID]
			agent.mu.Unlock()
			require.ErrorIs(t, cause, ErrStopped, "the turn's context ends as a stop ends it")
			replies := b.replies(key)
			require.Len(t, replies, 2)
			require.Equal(t, shown, replies[0].Content, "the stopped reply is what the turn showed")
			require.True(t, replies[0].Stopped, "marked stopped")
			require.True(t, replies[0].Superseded, "and superseded by the reply that answers its message again")
			require.Equal(t, "answered: write|two", replies[1].Content, "one turn answers the earlier message and the new one")
			require.False(t, replies[1].Stopped)
			require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized' AND cardinality(outbox_ids) = 2`))
			require.True(t, evs.has(key, batonnats.EventStopped))
		})
	}
}

// TestAnInterruptDuringAWriteWaitsForItAndNeverRunsItAgain: the write
// returns first (its outcome journaled), then the turn ends as a stop
// ends it: a turn that may have had a side effect is never answered
// again, so the new message gets a turn of its own.
func TestAnInterruptDuringAWriteWaitsForItAndNeverRunsItAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := answeringAgent{newWritingAgent(5 * time.Millisecond)}
	tool := &blockingWrite{started: make(chan struct{}, 1), release: make(chan struct{})}
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.Lease, cfg.OnConversationEvent = agent, time.Minute, evs.record
	cfg.Tools = Tools{}.Register(tool)
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.policy("c", schema.DoubleTextingInterrupt)
	b.Send("c", "m1", "/tool slow_write")
	testenv.WaitOrTimeout(t, tool.started, 20*time.Second, "the write to start")
	res := b.sendResult("c", "m2", "two")
	require.NoError(t, b.NC.Publish(batonnats.StopSubject(res.ConversationKey, res.InterruptedRunID), nil))
	close(tool.release)
	evs.wait(t, 15*time.Second, key, batonnats.EventReplied)
	b.settled(20 * time.Second)

	tool.mu.Lock()
	require.Equal(t, 1, tool.runs, "the write ran once")
	tool.mu.Unlock()
	replies := b.replies(key)
	require.Len(t, replies, 2)
	require.True(t, replies[0].Stopped)
	require.False(t, replies[0].Superseded, "its message is not answered again")
	require.Equal(t, "answered: two", replies[1].Content, "the new message is answered alone")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations o JOIN messages m ON m.id = o.message_id
		WHERE o.status = 'completed' AND m.stopped`), "the completed write belongs to the stopped reply")
}

// mailTool is a write whose every call needs a person's approval, and
// counts the calls sent.
type mailTool struct{ calls atomic.Int32 }

func (*mailTool) Name() string        { return "mail__send" }
func (*mailTool) Version() string     { return "1" }
func (*mailTool) Effect() Effect      { return EffectWrite }
func (*mailTool) NeedsApproval() bool { return true }
func (m *mailTool) Call(context.Context, Invocation) (string, error) {
	m.calls.Add(1)
	return "sent", nil
}

// mailAgent asks to send mail for a turn whose newest message is "mail
// bob", and says what the call answered; any other turn it answers at
// once with its messages' contents.
type mailAgent struct{}

func (mailAgent) Step(_ context.Context, req StepRequest) (Step, error) {
	ms := req.Turn.Messages
	if ms[len(ms)-1].Content == "mail bob" {
		if req.Index == 0 {
			return Step{Calls: []ToolCall{{ID: "call_1", Tool: "mail__send", Arguments: json.RawMessage(`{"to":"bob"}`)}}}, nil
		}
		r := req.Steps[len(req.Steps)-1].Results[0]
		return Step{Text: "mail: " + r.Output + r.Error}, nil
	}
	return Step{Text: "answered: " + strings.Join(messageContents(ms), "|")}, nil
}

// TestWhileATurnWaitsForAnApprovalEnqueueWaitsAndInterruptDeniesIt: a
// conversation that enqueues keeps the new message until the approval is
// decided and the turn answered, then answers it alone; one that
// interrupts denies the approval (the call is never sent) and answers
// the waiting message with the new one.
func TestWhileATurnWaitsForAnApprovalEnqueueWaitsAndInterruptDeniesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs events
	tool := &mailTool{}
	cfg := b.testConfig()
	cfg.Agent, cfg.OnConversationEvent = mailAgent{}, evs.record
	cfg.Tools = Tools{}.Register(tool)
	b.startWorker(cfg)
	ctx := context.Background()
	keys := map[schema.DoubleTexting]string{}
	for _, p := range []schema.DoubleTexting{schema.DoubleTextingEnqueue, schema.DoubleTextingInterrupt} {
		keys[p] = b.Conversation(string(p))
		b.policy(string(p), p)
		b.Send(string(p), string(p)+"-1", "mail bob")
		evs.wait(t, 20*time.Second, keys[p], batonnats.EventWaitingForApproval)
		b.Send(string(p), string(p)+"-2", "two")
	}

	// interrupt: the approval is denied by the message, and one turn
	// answers both.
	cut := keys[schema.DoubleTextingInterrupt]
	evs.wait(t, 20*time.Second, cut, batonnats.EventReplied)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM approvals WHERE conversation_id = $1 AND status = 'denied'`, cut), "the approval is denied")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations WHERE conversation_id = $1 AND status = 'denied'`, cut), "its call is never sent")
	var got []string
	for _, m := range b.replies(cut) {
		got = append(got, m.Content)
	}
	require.Equal(t, []string{"answered: mail bob|two"}, got)

	// enqueue: the new message waits for the decision.
	queue := keys[schema.DoubleTextingEnqueue]
	require.Empty(t, b.replies(queue), "nothing is answered while the approval waits")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_outbox WHERE conversation_id = $1 AND status = 'pending'`, queue))
	approvals, err := schema.ListApprovals(ctx, b.DB.Pool, b.Owner, string(schema.DoubleTextingEnqueue), 10)
	require.NoError(t, err)
	require.Len(t, approvals, 1)
	require.NoError(t, pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
		_, err := schema.DecideApprovalTx(ctx, tx, b.Owner, string(schema.DoubleTextingEnqueue), approvals[0].ID, schema.Decision{Approved: true, UserID: b.Owner})
		return err
	}))
	b.settled(30 * time.Second)
	got = nil
	for _, m := range b.replies(queue) {
		got = append(got, m.Content)
	}
	require.Equal(t, []string{"mail: sent", "answered: two"}, got, "the approved turn ends, then the new message gets its own reply")
	require.Equal(t, int32(1), tool.calls.Load(), "only the approved call was sent")
}
