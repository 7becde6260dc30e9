package agent_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	batonnats "github.com/batonhq/baton/nats"
)

// TestTheModelsReasoningIsShownAndKeptButNeverSentBack: a server that
// sends the model's reasoning beside its content (reasoning_content, or
// reasoning) has it streamed as reasoning, never as text, and kept in the
// reply, a paragraph per step; the request of the next step holds the
// earlier step's content and tool call, and none of its reasoning.
func TestTheModelsReasoningIsShownAndKeptButNeverSentBack(t *testing.T) {
	both(t, func(t *testing.T, streaming bool) {
		turn := turnOf("weather in Lima?")
		pub, sub := liveSetup(t, turn.ConversationID, turn.RunID)
		srv := agenttest.NewServer(t,
			agenttest.Response{Reasoning: "The user asks for the weather: call the tool.", Content: "Let me check.",
				ToolCalls: []agenttest.ToolCall{{ID: "call_w", Name: "weather", Arguments: `{"city":"Lima"}`}}},
			agenttest.Response{Reasoning: "The tool says sunny.", ReasoningField: "reasoning", Content: "It is sunny in Lima."},
		)
		var n int
		var mu sync.Mutex
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		ex := newExecutor(agent.NewRegistry(weather(&n, &mu)))
		ex.live = pub
		reply, err := run(context.Background(), a, turn, ex)
		require.NoError(t, err)
		require.Equal(t, "Let me check.\n\nIt is sunny in Lima.", reply.Content, "no reasoning in the text")
		require.Equal(t, "The user asks for the weather: call the tool.\n\nThe tool says sunny.", reply.Reasoning)

		events := liveEvents(t, pub, sub)
		requireSequenced(t, turn.RunID, events)
		var live batonnats.LiveReply
		reasoningDeltas := 0
		for _, e := range events {
			live.Apply(e)
			if e.Type == batonnats.DeltaReasoning {
				reasoningDeltas++
			}
		}
		require.Equal(t, reply.Content, live.Text())
		require.Equal(t, reply.Reasoning, live.Reasoning())
		require.Equal(t, []batonnats.LivePart{
			{Type: batonnats.PartReasoning, Text: "The user asks for the weather: call the tool."},
			{Type: batonnats.PartText, Text: "Let me check."},
			{Type: batonnats.PartReasoning, Text: "\n\nThe tool says sunny."},
			{Type: batonnats.PartText, Text: "\n\nIt is sunny in Lima."},
		}, live.Parts, "each step's reasoning before its text")
		if streaming {
			require.Greater(t, reasoningDeltas, 10, "the reasoning streams in pieces as the model writes it")
		}

		reqs := srv.Requests()
		require.Len(t, reqs, 2)
		second := reqs[1]
		require.Equal(t, "user assistant tool", second.Roles())
		require.Equal(t, "Let me check.", second.Messages[1].Text(), "the step's content goes back to the model")
		for _, sent := range []string{"call the tool", "reasoning"} {
			require.False(t, bytes.Contains(second.Body, []byte(sent)), "the next request holds none of the reasoning (%q): %s", sent, second.Body)
		}
	})
}

// TestARetriedModelCallVoidsTheReasoningItShowed: a stream cut after its
// reasoning and part of its text is retried, and the live reply drops
// both before the retry shows its own.
func TestARetriedModelCallVoidsTheReasoningItShowed(t *testing.T) {
	t.Parallel()
	turn := turnOf("hi")
	pub, sub := liveSetup(t, turn.ConversationID, turn.RunID)
	srv := agenttest.NewServer(t,
		agenttest.Response{Reasoning: "A first thought that will be void.", Content: "Draft that will be cut off", CutAfter: 2},
		agenttest.Response{Reasoning: "Better.", Content: "Final answer."},
	)
	a := newAgent(t, srv, nil)
	ex := newExecutor(agent.NewRegistry())
	ex.live = pub
	reply, err := run(context.Background(), a, turn, ex)
	require.NoError(t, err)
	require.Equal(t, "Final answer.", reply.Content)
	require.Equal(t, "Better.", reply.Reasoning, "the cut attempt's reasoning is no part of the reply")

	events := liveEvents(t, pub, sub)
	requireSequenced(t, turn.RunID, events)
	var live batonnats.LiveReply
	var resets int
	for _, e := range events {
		if e.Type == batonnats.DeltaReset {
			resets++
			require.Empty(t, e.Text, "nothing stood before the cut step")
			require.Empty(t, e.Reasoning, "nor any reasoning")
			require.Contains(t, live.Reasoning(), "void", "the reset comes after the reasoning showed")
		}
		live.Apply(e)
	}
	require.Equal(t, 1, resets)
	require.Equal(t, []batonnats.LivePart{{Type: batonnats.PartReasoning, Text: "Better."}, {Type: batonnats.PartText, Text: "Final answer."}}, live.Parts)
}
