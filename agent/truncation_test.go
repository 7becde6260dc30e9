package agent_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
)

func TestAReplyCutOffAtTheOutputLimitIsMarkedTruncated(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, agenttest.Response{Content: "The three reasons are: first, the", FinishReason: "length"})
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		reply, err := run(context.Background(), a, turnOf("why?"), newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		require.Equal(t, consumer.Reply{Content: "The three reasons are: first, the", Truncated: true}, reply)
		require.Len(t, srv.Requests(), 1)
	})
}

func TestAToolCallCutOffAtTheOutputLimitDoesNotRun(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, agenttest.Response{
			Content:      "Let me check the weather.",
			ToolCalls:    []agenttest.ToolCall{{ID: "call_1", Name: "weather", Arguments: `{"city":"Li`}},
			FinishReason: "length",
		})
		var n int
		var mu sync.Mutex
		reg := agent.NewRegistry(weather(&n, &mu))
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		ex := newExecutor(reg)
		reply, err := run(context.Background(), a, turnOf("weather in Lima?"), ex)
		require.NoError(t, err)
		require.Equal(t, consumer.Reply{Content: "Let me check the weather.", Truncated: true}, reply)
		require.Empty(t, ex.called(), "half a tool call must not reach the journal")
		require.Zero(t, n)
		require.Len(t, srv.Requests(), 1)
	})
}

func TestACutOffAfterAToolRoundKeepsTheTextSoFar(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t,
			agenttest.Response{Content: "Let me check.", ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "weather", Arguments: `{"city":"Lima"}`}}},
			agenttest.Response{Content: "It is sunny in Lima, and tomorrow", FinishReason: "length"},
		)
		var n int
		var mu sync.Mutex
		reg := agent.NewRegistry(weather(&n, &mu))
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		reply, err := run(context.Background(), a, turnOf("weather in Lima?"), newExecutor(reg))
		require.NoError(t, err)
		require.Equal(t, consumer.Reply{Content: "Let me check.\n\nIt is sunny in Lima, and tomorrow", Truncated: true}, reply)
		require.Equal(t, 1, n)
		require.Len(t, srv.Requests(), 2)
	})
}
