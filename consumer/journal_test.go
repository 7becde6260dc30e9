package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// ticketTool is a write that counts its executions.
type ticketTool struct {
	mu    sync.Mutex
	calls int
}

func (*ticketTool) Name() string    { return "ticket" }
func (*ticketTool) Version() string { return "1" }
func (*ticketTool) Effect() Effect  { return EffectWrite }
func (t *ticketTool) Call(context.Context, Invocation) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	return "T-1", nil
}

func (t *ticketTool) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls
}

// journalAgent opens a ticket in its first step and answers with its
// result in the second (other messages are just noted); the first time it is asked for the second step it
// runs beforeFail and fails as a model call that may pass does.
type journalAgent struct {
	beforeFail func()

	mu sync.Mutex
	// asked counts the agent's steps by index; messages are the turn's
	// messages each time it was asked for the second step.
	asked    map[int]int
	messages [][]string
	signal   testenv.Signal
}

var errModelBlip = errors.New("the model server failed for a moment")

func (a *journalAgent) Step(ctx context.Context, req StepRequest) (Step, error) {
	a.mu.Lock()
	a.asked[req.Index]++
	n := a.asked[req.Index]
	if req.Index == 1 {
		var ms []string
		for _, m := range req.Turn.Messages {
			ms = append(ms, m.Content)
		}
		a.messages = append(a.messages, ms)
	}
	a.mu.Unlock()
	a.signal.Notify()
	switch {
	case req.Turn.Messages[0].Content != "open a ticket":
		return Step{Text: "noted"}, nil
	case req.Index == 0:
		return Step{Text: "Opening a ticket.", Calls: []ToolCall{{ID: "call_w", Tool: "ticket", Arguments: json.RawMessage(`{}`)}}}, nil
	case n == 1:
		if a.beforeFail != nil {
			a.beforeFail()
		}
		return Step{}, errModelBlip
	}
	return Step{Text: "Done: " + req.Steps[0].Results[0].Output}, nil
}

func (a *journalAgent) count(index int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked[index]
}

// TestAFailedAttemptAfterAWriteGoesOnFromTheJournal: the step that opened
// the ticket is journaled, and so is the ticket's result; the attempt that
// fails after it is retried, and the retry goes on from the journal: the
// agent is not asked for the first step again, the ticket is not opened
// again, and the reply carries the first run's operation.
func TestAFailedAttemptAfterAWriteGoesOnFromTheJournal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := &journalAgent{asked: map[int]int{}}
	tool := &ticketTool{}
	cfg := b.testConfig()
	cfg.Agent, cfg.Tools = agent, Tools{}.Register(tool)
	b.startWorker(cfg)
	b.Conversation("c")
	b.Send("c", "m1", "open a ticket")
	b.settled(30 * time.Second)

	var content string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'assistant'`).Scan(&content))
	require.Equal(t, "Opening a ticket.\n\nDone: T-1", content)
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`), "a failure after a journaled write is retried, not shown")
	require.Equal(t, 1, tool.count(), "the ticket is opened once")
	require.Equal(t, 1, agent.count(0), "the journaled step is never asked again")
	require.Equal(t, 2, agent.count(1), "the step after it is asked again")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_runs`))
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_steps`))
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations o JOIN messages m ON m.id = o.message_id
		WHERE o.tool = 'ticket' AND o.status = 'completed' AND m.role = 'assistant'`), "the reply carries the ticket")
}

// TestANewerMessageWaitsWhileAJournaledTurnGoesOn: a message that arrives
// while a turn with a journaled write waits to be retried does not join
// that turn (its agent could ask for the write again); the turn is retried
// with exactly its own messages, and the newer one gets a turn of its own.
func TestANewerMessageWaitsWhileAJournaledTurnGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tool := &ticketTool{}
	agent := &journalAgent{asked: map[int]int{}}
	agent.beforeFail = func() {
		b.Send("c", "m2", "and another thing")
		b.Eventually(10*time.Second, func() bool {
			return b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'pending'`) == 1
		}, "the newer message is pending before the attempt fails")
	}
	cfg := b.testConfig()
	cfg.Agent, cfg.Tools = agent, Tools{}.Register(tool)
	b.startWorker(cfg)
	b.Conversation("c")
	b.Send("c", "m1", "open a ticket")
	b.settled(30 * time.Second)

	require.Equal(t, 1, tool.count(), "the ticket is opened once")
	agent.mu.Lock()
	messages := agent.messages
	agent.mu.Unlock()
	require.Equal(t, []string{"open a ticket"}, messages[0])
	require.Equal(t, []string{"open a ticket"}, messages[1], "the retried turn has exactly its own messages")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "the newer message is answered in a turn of its own")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`))
}
