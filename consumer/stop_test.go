package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// writingAgent writes its reply a word at a time through the step's Live,
// as a streaming model does, until its context ends; with a tool line
// ("/tool <name>") in the message its first step calls that tool. It
// records what it showed and why it ended.
type writingAgent struct {
	every time.Duration

	mu     sync.Mutex
	shown  map[string]string // by run
	causes map[string]error  // by run
	calls  int
	signal testenv.Signal
}

func newWritingAgent(every time.Duration) *writingAgent {
	return &writingAgent{every: every, shown: map[string]string{}, causes: map[string]error{}}
}

func (a *writingAgent) Step(ctx context.Context, req StepRequest) (Step, error) {
	turn := req.Turn
	if req.Index == 0 {
		a.mu.Lock()
		a.calls++
		a.mu.Unlock()
		content := turn.Messages[len(turn.Messages)-1].Content
		if tool, ok := strings.CutPrefix(content, "/tool "); ok {
			return Step{Calls: []ToolCall{{ID: "call_1", Tool: tool, Arguments: json.RawMessage(`{"text":"x"}`)}}}, nil
		}
	}
	tick := time.NewTicker(a.every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			a.end(turn.RunID, context.Cause(ctx))
			return Step{}, context.Cause(ctx)
		case <-tick.C:
		}
		word := "w" + strconv.Itoa(i) + " "
		req.Live.Text(word)
		a.mu.Lock()
		a.shown[turn.RunID] += word
		a.mu.Unlock()
		a.signal.Notify()
	}
}

func (a *writingAgent) end(runID string, cause error) {
	a.mu.Lock()
	a.causes[runID] = cause
	a.mu.Unlock()
	a.signal.Notify()
}

// words is how many words the agent showed in all.
func (a *writingAgent) words() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, s := range a.shown {
		n += strings.Count(s, " ")
	}
	return n
}

func (a *writingAgent) callCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// stop commits a stop of the bundle user's conversation and, with notify,
// publishes the notice as the API does.
func (b *bundle) stop(conversationID string, notify bool) schema.Stop {
	b.T.Helper()
	var s schema.Stop
	require.NoError(b.T, pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
		var err error
		s, err = schema.StopTx(context.Background(), tx, b.Owner, conversationID)
		return err
	}))
	if notify && s.RunID != "" {
		require.NoError(b.T, b.NC.Publish(batonnats.StopSubject(s.ConversationKey, s.RunID), nil))
	}
	return s
}

// TestAStopNoticeEndsTheTurnAtOnceWithWhatItShowed: the turn's lease is a
// minute, so its first renewal comes after 20 s: only the notice can end
// it within the wait. Its reply is the text it showed, marked stopped; the
// message that waited is settled; nothing of it runs again; a message
// after the stop gets its own turn.
func TestAStopNoticeEndsTheTurnAtOnceWithWhatItShowed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := newWritingAgent(5 * time.Millisecond)
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.Lease, cfg.OnConversationEvent = agent, time.Minute, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "write")
	testenv.WaitFor(t, &agent.signal, 20*time.Second, func() bool { return agent.words() >= 5 }, "the agent to write five words")
	b.Send("c", "m2", "waits")
	s := b.stop("c", true)
	require.NotEmpty(t, s.RunID)
	require.Len(t, s.SettledIDs, 1, "the waiting message is settled")

	evs.wait(t, 10*time.Second, key, batonnats.EventStopped)
	agent.mu.Lock()
	cause, shown := agent.causes[s.RunID], agent.shown[s.RunID]
	agent.mu.Unlock()
	require.ErrorIs(t, cause, ErrStopped, "the turn's context ends with the stop")
	var content string
	var stopped bool
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content, stopped FROM messages WHERE role = 'assistant'`).Scan(&content, &stopped))
	require.True(t, stopped)
	require.Equal(t, shown, content, "the stopped reply is what the turn showed")
	b.settled(20 * time.Second)
	require.Equal(t, 1, agent.callCount(), "a stopped turn is never run again")

	b.Send("c", "m3", "after")
	b.Eventually(20*time.Second, func() bool { return agent.callCount() == 2 }, "a message after the stop starts a turn")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_runs WHERE conversation_id = $1`, key))
}

// TestAWorkerThatMissesTheStopNoticeStopsAtItsNextRenewal: no notice, only
// the stop in PostgreSQL: the run learns it when it renews its lease.
func TestAWorkerThatMissesTheStopNoticeStopsAtItsNextRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := newWritingAgent(5 * time.Millisecond)
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.Lease, cfg.OnConversationEvent = agent, 1500*time.Millisecond, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "write")
	testenv.WaitFor(t, &agent.signal, 20*time.Second, func() bool { return agent.words() >= 3 }, "the agent to write")
	b.stop("c", false)
	evs.wait(t, 10*time.Second, key, batonnats.EventStopped)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND stopped AND content <> ''`))
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_runs r JOIN messages m ON m.id = r.reply_message_id WHERE r.status = 'finalized' AND m.stopped`))
}

// TestASnapshotIsTheReplySoFarUpToItsSeq: a client that joins a run late
// asks the worker for the reply so far; with the live deltas after its Seq
// it shows the reply exactly once, tool calls included.
func TestASnapshotIsTheReplySoFarUpToItsSeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := newWritingAgent(2 * time.Millisecond)
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.OnConversationEvent = agent, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	deltas := make(chan batonnats.LiveDelta, 10000)
	sub, err := b.NC.Subscribe(batonnats.LivePrefix+".>", func(m *natsclient.Msg) {
		if d, err := batonnats.ParseLiveDelta(m.Data); err == nil {
			deltas <- d
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, b.NC.Flush())

	b.Send("c", "m1", "/tool lookup")
	evs.wait(t, 20*time.Second, key, batonnats.EventProcessing)
	testenv.WaitFor(t, &agent.signal, 20*time.Second, func() bool { return agent.words() >= 10 }, "the agent to write")
	var runID string
	for _, ev := range evs.all {
		if ev.Type == batonnats.EventProcessing {
			runID = ev.RunID
			_, replyID, err := schema.TurnIDs(context.Background(), b.DB.Pool, key, ev.OutboxIDs, 0)
			require.NoError(t, err)
			require.Equal(t, replyID, ev.MessageID, "processing names the reply to come")
		}
	}
	msg, err := b.NC.Request(batonnats.SnapshotSubject(key, runID), nil, 5*time.Second)
	require.NoError(t, err)
	var snap batonnats.LiveReply
	require.NoError(t, json.Unmarshal(msg.Data, &snap))
	require.Equal(t, runID, snap.RunID)
	require.GreaterOrEqual(t, snap.Seq, int64(12), "a tool call and ten words")

	// Everything up to the snapshot's Seq, folded, is the snapshot.
	var seen batonnats.LiveReply
	for seen.Seq < snap.Seq {
		d := testenv.WaitOrTimeout(t, deltas, 10*time.Second, "delta %d of the snapshot", seen.Seq+1)
		require.Equal(t, seen.Seq+1, d.Seq, "deltas of a run come in order, without gaps")
		seen.Apply(d)
	}
	require.Equal(t, seen.Parts, snap.Parts)
	require.Equal(t, batonnats.PartTool, snap.Parts[0].Type)
	require.Equal(t, "lookup", snap.Parts[0].Tool)
	require.Equal(t, batonnats.ToolOutputAvailable, snap.Parts[0].State)
	require.Equal(t, `"x" has 1 characters`, snap.Parts[0].Output)
	require.True(t, strings.HasPrefix(snap.Parts[1].Text, "w0 w1 w2 "))

	_, err = b.NC.Request(batonnats.SnapshotSubject(key, "run_someone_else"), nil, 200*time.Millisecond)
	require.Error(t, err, "no worker answers for a run it does not hold")
	b.stop("c", true)
	evs.wait(t, 10*time.Second, key, batonnats.EventStopped)
}

// blockingWrite is a write tool that runs until released, and counts its
// executions.
type blockingWrite struct {
	started chan struct{}
	release chan struct{}
	mu      sync.Mutex
	runs    int
}

func (*blockingWrite) Name() string    { return "slow_write" }
func (*blockingWrite) Version() string { return "1" }
func (*blockingWrite) Effect() Effect  { return EffectWrite }
func (w *blockingWrite) Call(ctx context.Context, _ Invocation) (string, error) {
	w.mu.Lock()
	w.runs++
	w.mu.Unlock()
	w.started <- struct{}{}
	select {
	case <-w.release:
		return "written", nil
	case <-ctx.Done():
		return "", errors.New("cut short: outcome unknown")
	}
}

// TestAStopDuringAWriteLetsItFinishAndNeverRunsItAgain: the write runs to
// its end (its outcome known and journaled), then the turn ends stopped,
// with the write attached to its reply; nothing runs it a second time.
func TestAStopDuringAWriteLetsItFinishAndNeverRunsItAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := newWritingAgent(5 * time.Millisecond)
	tool := &blockingWrite{started: make(chan struct{}, 1), release: make(chan struct{})}
	var evs events
	var logs signalWriter
	log := zerolog.New(&logs)
	cfg := b.testConfig()
	cfg.Agent, cfg.Lease, cfg.OnConversationEvent, cfg.Logger = agent, time.Minute, evs.record, &log
	cfg.Tools = Tools{}.Register(tool)
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "/tool slow_write")
	testenv.WaitOrTimeout(t, tool.started, 20*time.Second, "the write to start")
	b.stop("c", true)
	testenv.WaitFor(t, &logs.signal, 10*time.Second, func() bool { return strings.Contains(logs.String(), "stop asked while a write runs") },
		"the worker to hold the stop until the write returns")
	close(tool.release)
	evs.wait(t, 10*time.Second, key, batonnats.EventStopped)
	b.settled(20 * time.Second)
	tool.mu.Lock()
	require.Equal(t, 1, tool.runs, "the write ran once")
	tool.mu.Unlock()
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations o JOIN messages m ON m.id = o.message_id
		WHERE o.status = 'completed' AND m.stopped`), "the completed write belongs to the stopped reply")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`))
}

// signalWriter keeps what a logger writes and signals each write.
type signalWriter struct {
	testenv.SyncBuffer
	signal testenv.Signal
}

func (w *signalWriter) Write(p []byte) (int, error) {
	n, err := w.SyncBuffer.Write(p)
	w.signal.Notify()
	return n, err
}

// approvalWrite is a write tool whose every call needs a person's
// approval; beforeAsk, when set, runs as the journal asks whether a call
// needs it.
type approvalWrite struct {
	calls     int
	beforeAsk func()
}

func (*approvalWrite) Name() string    { return "mail__send" }
func (*approvalWrite) Version() string { return "1" }
func (*approvalWrite) Effect() Effect  { return EffectWrite }
func (w *approvalWrite) NeedsApproval() bool {
	if w.beforeAsk != nil {
		w.beforeAsk()
	}
	return true
}
func (w *approvalWrite) Call(context.Context, Invocation) (string, error) {
	w.calls++
	return "sent", nil
}

// stoppingAgent shows a word and calls the tool.
type stoppingAgent struct{}

func (a *stoppingAgent) Step(ctx context.Context, req StepRequest) (Step, error) {
	if req.Index > 0 {
		return Step{}, errors.New("the turn was to stop at the call")
	}
	req.Live.Text("checking ")
	return Step{Text: "checking ", Calls: []ToolCall{{ID: "call_1", Tool: "mail__send", Arguments: json.RawMessage(`{"to":"bob"}`)}}}, nil
}

// TestAStopJustBeforeAnApprovalRequestEndsTheTurnStoppedWithoutWaiting:
// the stop commits as the agent stops for an approval, and the worker
// misses the notice; the park sees the stop, so the turn ends stopped with
// what it showed, and no approval waits, nor is the call journaled.
func TestAStopJustBeforeAnApprovalRequestEndsTheTurnStoppedWithoutWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs events
	tool := &approvalWrite{beforeAsk: func() { b.stop("c", false) }}
	cfg := b.testConfig()
	cfg.Agent = &stoppingAgent{}
	cfg.Lease, cfg.OnConversationEvent = time.Minute, evs.record
	cfg.Tools = Tools{}.Register(tool)
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "mail bob")
	evs.wait(t, 20*time.Second, key, batonnats.EventStopped)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND stopped AND content = 'checking '`),
		"the turn ends stopped with what it showed")
	require.Zero(t, b.Count(`SELECT count(*) FROM approvals`), "no approval waits for a stopped turn")
	require.Zero(t, b.Count(`SELECT count(*) FROM operations`), "the call is not journaled")
	require.Zero(t, b.Count(`SELECT count(*) FROM conversations WHERE approval_id IS NOT NULL OR run_id IS NOT NULL`))
	require.Zero(t, tool.calls)
	require.False(t, evs.has(key, batonnats.EventWaitingForApproval), "the turn never said it waits")
}
