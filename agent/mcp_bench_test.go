package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/bench"
	batonnats "github.com/batonhq/baton/nats"
)

// timedAgent times each tool call the agent asks for, as the turn runner
// makes it through its journal: from the step that asks for the call to
// the next step, which the turn runner asks for once the operation was
// started in PostgreSQL, the MCP call made and its outcome journaled.
type timedAgent struct {
	consumer.Agent
	mu    sync.Mutex
	asked map[string]time.Time // by run
	calls []time.Duration
}

func (a *timedAgent) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	a.mu.Lock()
	if t, ok := a.asked[req.Turn.RunID]; ok && req.Index > 0 {
		a.calls = append(a.calls, time.Since(t))
		delete(a.asked, req.Turn.RunID)
	}
	a.mu.Unlock()
	st, err := a.Agent.Step(ctx, req)
	if err == nil && len(st.Calls) > 0 {
		a.mu.Lock()
		a.asked[req.Turn.RunID] = time.Now()
		a.mu.Unlock()
	}
	return st, err
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkMCPCallOverhead measures an MCP tool call made through Baton
// (the operation journaled as started in PostgreSQL before the request
// leaves, and as completed after) against the same call made directly
// with the SDK, on the same Go SDK server over Streamable HTTP, alternating
// one of each. Run with:
//
//	go test -run '^$' -bench BenchmarkMCPCallOverhead -benchtime 1x ./agent/
func BenchmarkMCPCallOverhead(b *testing.B) {
	const calls = 300
	server := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "stamp", Description: "Stamps a document.", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "stamped"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	b.Cleanup(hs.Close)

	direct, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: hs.URL, DisableStandaloneSSE: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = direct.Close() })

	s := newStack(b)
	cfg := agent.MCPConfig{Servers: []agent.MCPServer{{Name: "b", URL: hs.URL}}, AllowPrivate: true}
	m, err := agent.NewMCP(cfg, s.db.Pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	model := agenttest.NewResponder(b, callOnce("b__stamp", `{"doc":"d"}`))
	reg := agent.NewRegistry()
	timed := &timedAgent{Agent: newAgent(b, model, nil), asked: map[string]time.Time{}}
	s.startWorker(timed, reg, func(c *consumer.Config) { c.ToolSource = m })

	var directCalls []time.Duration
	b.ResetTimer()
	for i := range calls {
		start := time.Now()
		if _, err := direct.CallTool(context.Background(), &mcp.CallToolParams{Name: "stamp", Arguments: map[string]any{"doc": "d"}}); err != nil {
			b.Fatal(err)
		}
		directCalls = append(directCalls, time.Since(start))
		conv := fmt.Sprintf("bench-%d", i)
		s.send(conv, conv, "stamp it")
		if ev := s.await(conv, batonnats.EventReplied, batonnats.EventFailed); ev.Type != batonnats.EventReplied {
			b.Fatalf("turn %d: %s", i, ev.Type)
		}
	}
	b.StopTimer()
	timed.mu.Lock()
	through := slices.Clone(timed.calls)
	timed.mu.Unlock()
	if len(through) != calls {
		b.Fatalf("timed %d calls through Baton, want %d", len(through), calls)
	}
	for _, q := range []struct {
		id   string
		name string
		p    float64
	}{{"mcp-a", "MCP tool call through Baton's journal vs the SDK directly, p50", 0.50}, {"mcp-b", "MCP tool call through Baton's journal vs the SDK directly, p99", 0.99}} {
		v, ref := percentile(through, q.p), percentile(directCalls, q.p)
		b.ReportMetric(float64(v.Microseconds()), q.id+"-baton-us")
		b.ReportMetric(float64(ref.Microseconds()), q.id+"-direct-us")
		bench.Record(b, bench.Figure{ID: q.id, Name: q.name, Value: v.Round(time.Microsecond).String(), Reference: ref.Round(time.Microsecond).String(),
			Ratio: float64(v) / float64(ref)})
	}
}
