package agent_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// executor runs tools like the turn runner's journal does, minus the
// journal: for tests of the model in the tool loop alone. Tests of
// journaling run the real worker on Postgres (worker_test.go).
type executor struct {
	runID string
	tools consumer.Tools
	// maxTools and live are the loop's MaxToolIterations and Live.
	maxTools int
	live     consumer.Publisher

	mu    sync.Mutex
	calls []consumer.ToolCall
}

func newExecutor(reg *agent.Registry) *executor {
	return &executor{runID: "run_test", tools: reg.Tools()}
}

func (e *executor) Call(ctx context.Context, c consumer.ToolCall) (string, error) {
	tool, ok := e.tools[c.Tool]
	if !ok {
		return "", consumer.ErrUnknownTool
	}
	e.mu.Lock()
	e.calls = append(e.calls, c)
	e.mu.Unlock()
	return tool.Call(ctx, consumer.Invocation{
		IdempotencyKey: consumer.IdempotencyKey(e.runID, c.ID),
		ConversationID: "conv",
		RunID:          e.runID,
		Arguments:      c.Arguments,
	})
}

// loopExecutor is an executor, or a test's executor built on one.
type loopExecutor interface {
	consumer.ToolExecutor
	base() *executor
}

func (e *executor) base() *executor { return e }

// run runs a turn's tool loop with a, as a worker does minus the journal:
// ex runs the calls.
func run(ctx context.Context, a consumer.Agent, turn consumer.Turn, ex loopExecutor) (consumer.Reply, error) {
	b := ex.base()
	return consumer.Loop{Agent: a, Tools: b.tools, Executor: ex, MaxToolIterations: b.maxTools, Live: b.live}.Run(ctx, turn)
}

func (e *executor) called() []consumer.ToolCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]consumer.ToolCall(nil), e.calls...)
}

// newAgent returns an agent against srv with short retry delays; change
// adjusts the configuration.
func newAgent(t testing.TB, srv *agenttest.Server, change func(*agent.Config)) *agent.OpenAI {
	t.Helper()
	cfg := agent.Config{
		BaseURL:        srv.BaseURL(),
		APIKey:         "sk-test",
		Model:          "test-model",
		RetryBaseDelay: 10 * time.Millisecond,
		MaxRetryDelay:  5 * time.Second,
		RequestTimeout: 10 * time.Second,
	}
	if change != nil {
		change(&cfg)
	}
	a, err := agent.NewOpenAI(cfg)
	require.NoError(t, err)
	return a
}

// turnOf is a turn of one user message after history.
func turnOf(content string, history ...schema.Message) consumer.Turn {
	return consumer.Turn{
		ConversationID: "conv",
		RunID:          "run_test",
		TurnID:         "turn_test",
		Attempt:        1,
		Messages:       []schema.Message{{ID: "m1", ConversationID: "conv", Role: schema.RoleUser, Content: content}},
		History:        history,
	}
}

// weather is a read tool with a schema, counting its executions.
func weather(count *int, mu *sync.Mutex) agent.Tool {
	return agent.Tool{
		Name:        "weather",
		Version:     "2",
		Description: "Current weather of a city.",
		Schema:      []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`),
		Effect:      agent.Read,
		Handler: func(_ context.Context, inv agent.Invocation) (string, error) {
			mu.Lock()
			*count++
			mu.Unlock()
			return "sunny in " + string(inv.Arguments), nil
		},
	}
}

// both runs f once with streaming and once without.
func both(t *testing.T, f func(t *testing.T, streaming bool)) {
	for _, streaming := range []bool{true, false} {
		name := "whole"
		if streaming {
			name = "streamed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, streaming)
		})
	}
}
