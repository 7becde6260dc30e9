package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// waitErr is a model server's "come back later".
type waitErr struct{ after time.Duration }

func (e waitErr) Error() string             { return "the model server asked to wait " + e.after.String() }
func (e waitErr) RetryAfter() time.Duration { return e.after }

// scriptedAgent answers each call of a conversation with the next step of
// its script, and records when each call started.
type scriptedAgent struct {
	mu     sync.Mutex
	steps  map[string][]func() (Reply, error)
	starts map[string][]time.Time
}

func (a *scriptedAgent) Step(_ context.Context, req StepRequest) (Step, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	turn := req.Turn
	a.starts[turn.ConversationID] = append(a.starts[turn.ConversationID], time.Now())
	steps := a.steps[turn.ConversationID]
	if len(steps) == 0 {
		return Step{Text: "fine"}, nil
	}
	step := steps[0]
	a.steps[turn.ConversationID] = steps[1:]
	r, err := step()
	return Step{Text: r.Content, Truncated: r.Truncated}, err
}

func (a *scriptedAgent) calls(conversation string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.starts[conversation]...)
}

// TestAModelThatAsksToWaitIsCalledAgainOnlyAfterTheWait: a Retry-After
// longer than a worker may wait inside its lease releases the turn with a
// not-before time: the conversation shows that it waits for the model,
// the next call starts no sooner than the wait ends, the turn then
// succeeds with two calls in all, and other conversations go on
// meanwhile. (The figure is 45 s; 3 s keeps the test short.)
func TestAModelThatAsksToWaitIsCalledAgainOnlyAfterTheWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	slow := b.Conversation("rate-limited")
	other := b.Conversation("other")
	const wait = 3 * time.Second
	agent := &scriptedAgent{
		steps:  map[string][]func() (Reply, error){slow: {func() (Reply, error) { return Reply{}, waitErr{wait} }}},
		starts: map[string][]time.Time{},
	}
	var st events
	cfg := b.testConfig()
	cfg.Agent = agent
	cfg.MaxAttempts = 3
	cfg.OnConversationEvent = st.record
	b.startWorker(cfg)

	b.Send("rate-limited", "m1", "hello")
	st.wait(t, 20*time.Second, slow, batonnats.EventWaiting)
	c, err := schema.GetConversation(ctx, b.DB.Pool, b.Owner, "rate-limited")
	require.NoError(t, err)
	require.Equal(t, schema.TurnWaiting, c.TurnState, "the conversation shows that it waits for the model")

	// Another conversation is not held up by the wait.
	b.Send("other", "o1", "hi")
	st.wait(t, 20*time.Second, other, batonnats.EventReplied)
	require.Len(t, agent.calls(slow), 1, "the waiting conversation was not called again meanwhile")

	st.wait(t, 30*time.Second, slow, batonnats.EventReplied)
	calls := agent.calls(slow)
	require.Len(t, calls, 2, "two calls in all: the one that was asked to wait, and the answer")
	require.GreaterOrEqual(t, calls[1].Sub(calls[0]), wait, "the second call starts no sooner than the wait")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND conversation_id = $1`, slow))
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`), "a wait is not a failure the user sees")
}

// TestATruncatedReplyIsStoredAsTruncated: a reply the model cut off is
// stored with its mark, never as a silent whole.
func TestATruncatedReplyIsStoredAsTruncated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := b.Conversation("c")
	agent := &scriptedAgent{
		steps:  map[string][]func() (Reply, error){key: {func() (Reply, error) { return Reply{Content: "The answer is", Truncated: true}, nil }}},
		starts: map[string][]time.Time{},
	}
	cfg := b.testConfig()
	cfg.Agent = agent
	b.startWorker(cfg)
	b.Send("c", "m1", "tell me")
	b.settled(20 * time.Second)
	msgs, _, err := schema.ListMessages(ctx, b.DB.Pool, b.Owner, "c", "", 10)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.Equal(t, "The answer is", msgs[1].Content)
	require.True(t, msgs[1].Truncated, "the reply says it was cut off")
	require.False(t, msgs[0].Truncated)
}

// TestAShutdownRecordsItsOwnReason: a run given up because its worker
// shut down says so, not "lease expired".
func TestAShutdownRecordsItsOwnReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	cfg := b.testConfig()
	cfg.ShutdownTimeout = 100 * time.Millisecond
	w, err := New(cfg, b.DB.Pool, b.JS)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.Send("c", "m1", "/sleep 1h\nlong")
	b.Eventually(20*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'running'`) == 1
	}, "the turn runs")
	cancel()
	require.NoError(t, <-done)
	var reason string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT error FROM agent_runs`).Scan(&reason))
	require.Equal(t, schema.RecoveryReasonShutdown, reason)
}

// reasonErr is an agent failure that names its kind.
type reasonErr struct{ reason string }

func (e reasonErr) Error() string         { return "the model failed: " + e.reason }
func (e reasonErr) FailureReason() string { return e.reason }

// TestFailedAttemptsAreCountedByTheirReason: each failed attempt counts
// once under the reason its error names; an error without one, or with a
// reason that is not a short plain word, counts as "other".
func TestFailedAttemptsAreCountedByTheirReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fail := func(err error) func() (Reply, error) { return func() (Reply, error) { return Reply{}, err } }
	agent := &scriptedAgent{
		steps: map[string][]func() (Reply, error){
			b.Conversation("busy"):  {fail(reasonErr{"rate_limited"}), fail(reasonErr{"rate_limited"})},
			b.Conversation("plain"): {fail(errors.New("no reason given"))},
			b.Conversation("noisy"): {fail(reasonErr{"Model said: 'no' at 12:00"})},
		},
		starts: map[string][]time.Time{},
	}
	reg := prometheus.NewRegistry()
	cfg := b.testConfig()
	cfg.Agent = agent
	cfg.MaxAttempts = 5
	cfg.Registerer = reg
	b.startWorker(cfg)
	for _, c := range []string{"busy", "plain", "noisy"} {
		b.Send(c, c+"-1", "hello")
	}
	b.settled(30 * time.Second)
	require.Equal(t, 3, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "every turn answered in the end")

	got := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "baton_turn_failures_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{"rate_limited": 2, ReasonOther: 2, ReasonTurnTimeout: 0}, got)
}
