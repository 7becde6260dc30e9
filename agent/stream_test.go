package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// liveSetup connects a publisher and a subscriber of the run's live
// subject to a real NATS server.
func liveSetup(t *testing.T, conversationID, runID string) (pub *natsclient.Conn, sub *natsclient.Subscription) {
	t.Helper()
	n := testenv.StartNATS(t)
	pub, _ = n.Connect(t)
	subConn, _ := n.Connect(t)
	sub, err := subConn.SubscribeSync(batonnats.LiveSubject(conversationID, runID))
	require.NoError(t, err)
	require.NoError(t, subConn.Flush(), "the subscription must reach the server before anything is published")
	return pub, sub
}

// liveEvents reads the run's events up to its done event.
func liveEvents(t *testing.T, pub *natsclient.Conn, sub *natsclient.Subscription) []batonnats.LiveDelta {
	t.Helper()
	require.NoError(t, pub.Flush())
	var out []batonnats.LiveDelta
	for {
		msg, err := sub.NextMsg(5 * time.Second)
		require.NoError(t, err, "waiting for live event %d", len(out)+1)
		e, err := batonnats.ParseLiveDelta(msg.Data)
		require.NoError(t, err)
		out = append(out, e)
		if e.Type == batonnats.DeltaDone {
			return out
		}
	}
}

func requireSequenced(t *testing.T, runID string, events []batonnats.LiveDelta) {
	t.Helper()
	for i, e := range events {
		require.Equal(t, runID, e.RunID)
		require.Equal(t, int64(i+1), e.Seq, "event %d arrived out of order or after a gap", i+1)
	}
}

func TestStreamedDeltasArriveInOrderAndAddUpToTheReply(t *testing.T) {
	t.Parallel()
	turn := turnOf("weather in Lima?")
	pub, sub := liveSetup(t, "conv.with*odd>chars", turn.RunID)
	turn.ConversationID = "conv.with*odd>chars"

	srv := agenttest.NewServer(t,
		agenttest.Response{Content: "Let me check the weather.", ToolCalls: []agenttest.ToolCall{{ID: "call_w", Name: "weather", Arguments: `{"city":"Lima"}`}}},
		agenttest.Response{Content: "It is sunny in Lima, 24 degrees, light wind from the west.", ChunkSize: 2},
	)
	var n int
	var mu sync.Mutex
	reg := agent.NewRegistry(weather(&n, &mu))
	a := newAgent(t, srv, nil)
	ex := newExecutor(reg)
	ex.live = pub
	reply, err := run(context.Background(), a, turn, ex)
	require.NoError(t, err)
	require.Equal(t, "Let me check the weather.\n\nIt is sunny in Lima, 24 degrees, light wind from the west.", reply.Content)

	events := liveEvents(t, pub, sub)
	requireSequenced(t, turn.RunID, events)
	var text string
	for _, e := range events[:len(events)-1] {
		require.Equal(t, batonnats.DeltaText, e.Type, "event %d: a clean turn has only deltas before done", e.Seq)
		text += e.Text
	}
	require.Greater(t, len(events), 20, "the reply must stream in many pieces, not at once")
	require.Equal(t, reply.Content, text, "the deltas must add up to the reply")
}

func TestARetriedStreamResetsTheLiveReply(t *testing.T) {
	t.Parallel()
	turn := turnOf("hi")
	pub, sub := liveSetup(t, turn.ConversationID, turn.RunID)
	srv := agenttest.NewServer(t,
		agenttest.Response{Content: "Draft that will be cut off", CutAfter: 3},
		agenttest.Response{Status: 500, Body: `{"error":{"message":"boom"}}`},
		agenttest.Response{Content: "Final answer."},
	)
	a := newAgent(t, srv, nil)
	ex := newExecutor(agent.NewRegistry())
	ex.live = pub
	reply, err := run(context.Background(), a, turn, ex)
	require.NoError(t, err)
	require.Equal(t, "Final answer.", reply.Content)

	events := liveEvents(t, pub, sub)
	requireSequenced(t, turn.RunID, events)
	require.Equal(t, "Dra", events[0].Text)
	resets := 0
	for _, e := range events {
		if e.Type == batonnats.DeltaReset {
			resets++
			require.Empty(t, e.Text, "nothing stood before the cut step")
		}
	}
	require.Equal(t, 1, resets, "one reset for the one step that streamed before it failed")
	require.Equal(t, batonnats.DeltaReset, events[3].Type, "the reset follows the three chunks that arrived")
	require.Equal(t, reply.Content, batonnats.LiveText(events))
}

func TestALaterAttemptStartsWithAResetAndAFailedOneEndsWithOne(t *testing.T) {
	t.Parallel()
	turn := turnOf("hi")
	turn.Attempt = 2
	pub, sub := liveSetup(t, turn.ConversationID, turn.RunID)
	srv := agenttest.NewServer(t, agenttest.Response{Content: "partial", CutAfter: 1})
	a := newAgent(t, srv, func(c *agent.Config) { c.MaxModelCalls = 1 })
	ex := newExecutor(agent.NewRegistry())
	ex.live = pub
	_, err := run(context.Background(), a, turn, ex)
	require.ErrorIs(t, err, agent.ErrBudgetExceeded)

	require.NoError(t, pub.Flush())
	var events []batonnats.LiveDelta
	for {
		msg, err := sub.NextMsg(5 * time.Second)
		require.NoError(t, err)
		e, err := batonnats.ParseLiveDelta(msg.Data)
		require.NoError(t, err)
		events = append(events, e)
		if len(events) > 1 && e.Type == batonnats.DeltaReset {
			break
		}
	}
	requireSequenced(t, turn.RunID, events)
	require.Equal(t, batonnats.DeltaReset, events[0].Type, "a second attempt first clears what the first one showed")
	require.Equal(t, "", batonnats.LiveText(events), "a failed attempt leaves nothing shown")
}
