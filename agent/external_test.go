package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// wire is how one protocol's fake agent writes the events of a step.
type wire struct {
	protocol string
	// step is a whole answer made of the given events.
	step func(events ...[]string) []string
	text func(id, text string, size int) []string
	call func(id, name, args string) []string
	// output is the result of a tool the agent ran itself.
	output func(id, output string) []string
	// failure is an event by which the agent reports a failed run.
	failure string
	// end is the event that ends a step.
	end string
}

var wires = []wire{
	{
		protocol: agent.ProtocolAGUI, step: agenttest.AGUIRun, text: agenttest.AGUIText, call: agenttest.AGUIToolCall,
		output: agenttest.AGUIToolResult, failure: agenttest.AGUIRunError("the model is overloaded"),
		end: agenttest.JSON(map[string]any{"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}),
	},
	{
		protocol: agent.ProtocolAISDK, step: agenttest.UIStream, text: agenttest.UIText, call: agenttest.UIToolCall,
		output: agenttest.UIToolOutput, failure: agenttest.JSON(map[string]any{"type": "error", "errorText": "the model is overloaded"}),
		end: agenttest.JSON(map[string]any{"type": "finish"}),
	},
}

// eachWire runs f for each protocol, in parallel.
func eachWire(t *testing.T, f func(t *testing.T, w wire)) {
	for _, w := range wires {
		t.Run(w.protocol, func(t *testing.T) {
			t.Parallel()
			f(t, w)
		})
	}
}

// newExternal returns an external agent of protocol against srv with
// short retry delays; change adjusts the configuration.
func newExternal(t testing.TB, protocol string, srv *agenttest.Agent, change func(*agent.ExternalConfig)) *agent.External {
	t.Helper()
	cfg := agent.ExternalConfig{
		Protocol:       protocol,
		URL:            srv.URL + "/agent",
		RetryBaseDelay: 10 * time.Millisecond,
		MaxRetryDelay:  time.Second,
		Timeout:        10 * time.Second,
	}
	if change != nil {
		change(&cfg)
	}
	x, err := agent.NewExternal(cfg)
	require.NoError(t, err)
	return x
}

// weatherSpec declares the weather tool (see weather).
var weatherSpec = consumer.ToolSpec{
	Name:        "weather",
	Description: "Current weather of a city.",
	Schema:      json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`),
}

// recordLive is a step's live reply, recorded: each piece of text, and
// "<retry>" where the step was tried again.
type recordLive struct {
	mu     sync.Mutex
	pieces []string
	// thoughts are the pieces of reasoning.
	thoughts []string
}

func (l *recordLive) Text(delta string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pieces = append(l.pieces, delta)
}

func (l *recordLive) Reasoning(delta string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.thoughts = append(l.thoughts, delta)
}

func (l *recordLive) Retry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pieces = append(l.pieces, "<retry>")
}

func (l *recordLive) shown() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.pieces...)
}

// stepOnce asks x for the first step of turn, with the weather tool.
func stepOnce(ctx context.Context, x *agent.External, turn consumer.Turn, live consumer.StepLive) (consumer.Step, error) {
	return x.Step(ctx, consumer.StepRequest{Turn: &turn, Tools: []consumer.ToolSpec{weatherSpec}, Live: live})
}

func weatherRegistry() *agent.Registry {
	var n int
	var mu sync.Mutex
	return agent.NewRegistry(weather(&n, &mu))
}

func TestAnExternalAgentsReplyStreamsLiveAndAddsUpToTheReply(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		turn := turnOf("weather in Lima?")
		pub, sub := liveSetup(t, turn.ConversationID, turn.RunID)
		srv := agenttest.NewAgent(t,
			agenttest.AgentReply{Frames: w.step(w.text("a1", "Let me check the weather.", 4), w.call("call_w", "weather", `{"city":"Lima"}`))},
			agenttest.AgentReply{Frames: w.step(w.text("a2", "It is sunny in Lima, 24 degrees, light wind from the west.", 2))},
		)
		ex := newExecutor(weatherRegistry())
		ex.live = pub
		reply, err := run(context.Background(), newExternal(t, w.protocol, srv, nil), turn, ex)
		require.NoError(t, err)
		require.Equal(t, "Let me check the weather.\n\nIt is sunny in Lima, 24 degrees, light wind from the west.", reply.Content)
		require.Len(t, ex.called(), 1, "the declared tool's call came back to Baton, which ran it")

		events := liveEvents(t, pub, sub)
		requireSequenced(t, turn.RunID, events)
		var text string
		for _, e := range events[:len(events)-1] {
			require.Equal(t, batonnats.DeltaText, e.Type, "event %d: a clean turn has only deltas before done", e.Seq)
			text += e.Text
		}
		require.Greater(t, len(events), 20, "the reply streams in many pieces, as the agent writes it")
		require.Equal(t, reply.Content, text, "the deltas add up to the reply")
	})
}

// history is what was said before the turn, with an error message that
// is Baton's and not sent to agents.
func history() []schema.Message {
	return []schema.Message{
		{ID: "h1", Role: schema.RoleUser, Content: "hello", Seq: 1},
		{ID: "h2", Role: schema.RoleAssistant, Content: "Hi! How can I help?", Seq: 2},
		{ID: "h3", Role: schema.RoleError, Content: "The assistant's model is busy.", Seq: 3},
	}
}

// twoCallsThenText is an agent that asks for the weather twice, once
// with arguments the tool's schema refuses, then answers.
func twoCallsThenText(w wire) *[]agenttest.AgentReply {
	return &[]agenttest.AgentReply{
		{Frames: w.step(w.call("call_w", "weather", `{"city":"Lima"}`), w.call("call_bad", "weather", `{"town":"Lima"}`))},
		{Frames: w.step(w.text("a2", "Sunny.", 3))},
	}
}

func TestAnAGUIStepCarriesTheTurnAndTheResultsOfEarlierCalls(t *testing.T) {
	t.Parallel()
	w := wires[0]
	srv := agenttest.NewAgent(t, *twoCallsThenText(w)...)
	turn := turnOf("weather in Lima?", history()...)
	turn.Epoch = 2
	ex := newExecutor(weatherRegistry())
	reply, err := run(context.Background(), newExternal(t, w.protocol, srv, nil), turn, ex)
	require.NoError(t, err)
	require.Equal(t, "Sunny.", reply.Content)
	require.Len(t, ex.called(), 1, "the call the schema refused does not run")

	reqs := srv.Requests()
	require.Len(t, reqs, 2)
	for i, r := range reqs {
		key := consumer.StepKey("conv", "turn_test", 2, i)
		require.Equal(t, key, r.Header.Get("Idempotency-Key"), "step %d", i)
		require.Equal(t, "text/event-stream", r.Header.Get("Accept"))
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		body := r.Map(t)
		require.Equal(t, "conv", body["threadId"], "the thread is the conversation's server key")
		require.Equal(t, key, body["runId"], "the run id is the step's key")
		require.Equal(t, "1.0", body["protocolVersion"])
		require.Equal(t, []any{}, body["context"])
		require.Equal(t, map[string]any{}, body["state"])
		require.Equal(t, map[string]any{"baton": map[string]any{"conversation": "conv", "turn": "turn_test", "step": float64(i), "attempt": float64(1), "epoch": float64(2)}}, body["forwardedProps"])
		require.Equal(t, []any{map[string]any{
			"name": "weather", "description": "Current weather of a city.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}, "additionalProperties": false},
		}}, body["tools"])
	}
	var first, second struct {
		Messages []map[string]any `json:"messages"`
	}
	reqs[0].Decode(t, &first)
	reqs[1].Decode(t, &second)
	conversation := []map[string]any{
		{"id": "h1", "role": "user", "content": "hello"},
		{"id": "h2", "role": "assistant", "content": "Hi! How can I help?"},
		{"id": "m1", "role": "user", "content": "weather in Lima?"},
	}
	require.Equal(t, conversation, first.Messages, "history and the turn, without Baton's error messages")
	require.Len(t, second.Messages, 6)
	require.Equal(t, conversation, second.Messages[:3])
	require.Equal(t, map[string]any{"id": "turn_test-0", "role": "assistant", "toolCalls": []any{
		map[string]any{"id": "call_w", "type": "function", "function": map[string]any{"name": "weather", "arguments": `{"city":"Lima"}`}},
		map[string]any{"id": "call_bad", "type": "function", "function": map[string]any{"name": "weather", "arguments": `{"town":"Lima"}`}},
	}}, second.Messages[3], "the earlier step, without content since it wrote no text")
	require.Equal(t, map[string]any{"id": "call_w-result", "role": "tool", "toolCallId": "call_w", "content": `sunny in {"city":"Lima"}`}, second.Messages[4])
	refused := second.Messages[5]
	require.Equal(t, "call_bad", refused["toolCallId"])
	require.Contains(t, refused["error"], "city", "the schema's refusal goes back to the agent")
	require.Equal(t, "error: "+refused["error"].(string), refused["content"], "and reads in the content, for agents that read no error")
}

func TestAnAISDKStepCarriesTheTurnAndTheResultsOfEarlierCalls(t *testing.T) {
	t.Parallel()
	w := wires[1]
	srv := agenttest.NewAgent(t, *twoCallsThenText(w)...)
	turn := turnOf("weather in Lima?", history()...)
	ex := newExecutor(weatherRegistry())
	reply, err := run(context.Background(), newExternal(t, w.protocol, srv, nil), turn, ex)
	require.NoError(t, err)
	require.Equal(t, "Sunny.", reply.Content)

	reqs := srv.Requests()
	require.Len(t, reqs, 2)
	for i, r := range reqs {
		key := consumer.StepKey("conv", "turn_test", 0, i)
		require.Equal(t, key, r.Header.Get("Idempotency-Key"), "step %d", i)
		require.Equal(t, "text/event-stream", r.Header.Get("Accept"))
		body := r.Map(t)
		require.Equal(t, "conv", body["id"], "the chat is the conversation's server key")
		require.Equal(t, "submit-message", body["trigger"])
		require.Equal(t, map[string]any{"conversation": "conv", "turn": "turn_test", "step": float64(i), "runId": key, "attempt": float64(1), "epoch": float64(0)}, body["baton"])
		require.Equal(t, []any{map[string]any{
			"name": "weather", "description": "Current weather of a city.",
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}, "additionalProperties": false},
		}}, body["tools"])
	}
	var first, second struct {
		Messages []map[string]any `json:"messages"`
	}
	reqs[0].Decode(t, &first)
	reqs[1].Decode(t, &second)
	text := func(s string) []any { return []any{map[string]any{"type": "text", "text": s}} }
	conversation := []map[string]any{
		{"id": "h1", "role": "user", "parts": text("hello")},
		{"id": "h2", "role": "assistant", "parts": text("Hi! How can I help?")},
		{"id": "m1", "role": "user", "parts": text("weather in Lima?")},
	}
	require.Equal(t, conversation, first.Messages, "history and the turn, without Baton's error messages")
	require.Len(t, second.Messages, 4)
	require.Equal(t, conversation, second.Messages[:3])
	steps := second.Messages[3]
	require.Equal(t, "turn_test", steps["id"])
	require.Equal(t, "assistant", steps["role"])
	parts := steps["parts"].([]any)
	require.Len(t, parts, 3)
	require.Equal(t, map[string]any{"type": "step-start"}, parts[0])
	require.Equal(t, map[string]any{"type": "dynamic-tool", "toolName": "weather", "toolCallId": "call_w", "state": "output-available",
		"input": map[string]any{"city": "Lima"}, "output": `sunny in {"city":"Lima"}`}, parts[1])
	refused := parts[2].(map[string]any)
	require.Equal(t, "output-error", refused["state"])
	require.Equal(t, map[string]any{"town": "Lima"}, refused["input"])
	require.Contains(t, refused["errorText"], "city", "the schema's refusal goes back to the agent")
}

func TestAnAgentsOwnToolsAreNotReturnedAsCalls(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(
			w.call("own_1", "search_docs", `{"q":"lima"}`), w.output("own_1", "Lima is the capital of Peru."),
			// A declared tool that the agent ran itself all the same:
			// it ran, so Baton does not run it again.
			w.call("own_2", "weather", `{"city":"Lima"}`), w.output("own_2", "sunny"),
			w.text("a1", "Lima is sunny.", 5),
		)})
		ex := newExecutor(weatherRegistry())
		reply, err := run(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("Lima?"), ex)
		require.NoError(t, err)
		require.Equal(t, "Lima is sunny.", reply.Content)
		require.Empty(t, ex.called(), "what the agent ran itself is not run again")
		require.Len(t, srv.Requests(), 1, "the step asked for no call of Baton's, so the turn ends")
	})
}

func TestAnAgentsCallOfAToolBatonDoesNotDeclareIsLeftOut(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(w.text("a1", "Let me see.", 4), w.call("c1", "launch_rockets", `{}`))})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("go"), nil)
		require.NoError(t, err)
		require.Equal(t, "Let me see.", st.Text)
		require.Empty(t, st.Calls, "only calls of declared tools come back to Baton")
	})
}

func TestMastraStyleChunksAloneMakeTheReply(t *testing.T) {
	t.Parallel()
	frames := agenttest.AGUIRun(
		agenttest.AGUITextChunks("msg_1", "Lima is sunny ", 3),
		// A continuation chunk names no message: it continues the open
		// one.
		[]string{agenttest.JSON(map[string]any{"type": "TEXT_MESSAGE_CHUNK", "delta": "today."})},
		[]string{
			agenttest.JSON(map[string]any{"type": "TOOL_CALL_CHUNK", "toolCallId": "call_1", "toolCallName": "weather", "delta": `{"city":`}),
			agenttest.JSON(map[string]any{"type": "TOOL_CALL_CHUNK", "delta": `"Lima"}`}),
		},
	)
	srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: frames})
	live := &recordLive{}
	st, err := stepOnce(context.Background(), newExternal(t, agent.ProtocolAGUI, srv, nil), turnOf("Lima?"), live)
	require.NoError(t, err)
	require.Equal(t, "Lima is sunny today.", st.Text)
	require.Equal(t, []consumer.ToolCall{{ID: "call_1", Tool: "weather", Arguments: json.RawMessage(`{"city":"Lima"}`)}}, st.Calls)
	require.Equal(t, []string{"Lim", "a i", "s s", "unn", "y ", "today."}, live.shown(), "each chunk shows as it arrives")
	require.Equal(t, 1, st.Requests)
}

func TestTextOfTheAgentsSeveralMessagesIsParagraphs(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		var frames []string
		if w.protocol == agent.ProtocolAGUI {
			frames = w.step(w.text("m1", "Looking it up.", 5), w.call("own", "search", `{}`), w.output("own", "found"), w.text("m2", "Found it.", 5))
		} else {
			// The AI SDK: a step of the agent's own after its tool.
			frames = w.step(w.text("0", "Looking it up.", 5), w.call("own", "search", `{}`), w.output("own", "found"),
				[]string{agenttest.JSON(map[string]any{"type": "finish-step"}), agenttest.JSON(map[string]any{"type": "start-step"})},
				w.text("0", "Found it.", 5))
		}
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: frames})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("find it"), nil)
		require.NoError(t, err)
		require.Equal(t, "Looking it up.\n\nFound it.", st.Text)
	})
}

// TestReasoningAndSkippedEventsAreNotTheReply: events Baton does not use
// are skipped, and the agent's reasoning is shown live and kept as the
// step's reasoning, apart from its text; the reasoning of another message
// (AG-UI) or of another of the agent's own steps (the AI SDK) is a
// paragraph of its own.
func TestReasoningAndSkippedEventsAreNotTheReply(t *testing.T) {
	t.Parallel()
	ev := func(m map[string]any) []string { return []string{agenttest.JSON(m)} }
	srv := agenttest.NewAgent(t,
		agenttest.AgentReply{Frames: agenttest.AGUIRun(
			ev(map[string]any{"type": "STATE_SNAPSHOT", "snapshot": map[string]any{"k": "v"}}),
			ev(map[string]any{"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "think"}),
			ev(map[string]any{"type": "REASONING_MESSAGE_CHUNK", "delta": "ing"}),
			ev(map[string]any{"type": "REASONING_MESSAGE_CHUNK", "messageId": "r2", "delta": "more"}),
			ev(map[string]any{"type": "MESSAGES_SNAPSHOT", "messages": []any{}}),
			ev(map[string]any{"type": "CUSTOM", "name": "progress", "value": 1}),
			ev(map[string]any{"type": "STEP_STARTED", "stepName": "s"}),
			ev(map[string]any{"type": "SOMETHING_NEW", "x": 1}),
			// A user's text message, echoed: not the reply.
			ev(map[string]any{"type": "TEXT_MESSAGE_START", "messageId": "u1", "role": "user"}),
			ev(map[string]any{"type": "TEXT_MESSAGE_CONTENT", "messageId": "u1", "delta": "echo"}),
			agenttest.AGUIText("a1", "Answer.", 3),
		)},
		agenttest.AgentReply{Frames: agenttest.UIStream(
			ev(map[string]any{"type": "reasoning-start", "id": "r"}),
			ev(map[string]any{"type": "reasoning-delta", "id": "r", "delta": "thinking"}),
			ev(map[string]any{"type": "reasoning-end", "id": "r"}),
			ev(map[string]any{"type": "finish-step"}),
			ev(map[string]any{"type": "start-step"}),
			ev(map[string]any{"type": "reasoning-start", "id": "r2"}),
			ev(map[string]any{"type": "reasoning-delta", "id": "r2", "delta": "more"}),
			ev(map[string]any{"type": "reasoning-end", "id": "r2"}),
			ev(map[string]any{"type": "data-weather", "data": map[string]any{"t": 1}}),
			ev(map[string]any{"type": "source-url", "sourceId": "s", "url": "https://example.com"}),
			ev(map[string]any{"type": "message-metadata", "messageMetadata": map[string]any{}}),
			agenttest.UIText("t", "Answer.", 3),
		)},
	)
	for _, p := range []string{agent.ProtocolAGUI, agent.ProtocolAISDK} {
		live := &recordLive{}
		st, err := stepOnce(context.Background(), newExternal(t, p, srv, nil), turnOf("q"), live)
		require.NoError(t, err, p)
		require.Equal(t, "Answer.", st.Text, p)
		require.Equal(t, "thinking\n\nmore", st.Reasoning, p)
		require.Equal(t, st.Reasoning, strings.Join(live.thoughts, ""), "%s: the reasoning streamed as it came", p)
		require.Equal(t, st.Text, strings.Join(live.shown(), ""), "%s: no reasoning in the text shown", p)
	}
}

func TestEventsAfterTheStepsEndAreNotRead(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		frames := w.step(w.text("a1", "Done.", 5))
		frames = append(frames, w.text("a2", " More.", 5)...)
		frames = append(frames, "this is not JSON")
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: frames})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), nil)
		require.NoError(t, err)
		require.Equal(t, "Done.", st.Text)
	})
}

// TestAnInterruptIsAQuestionWhoseAnswerGoesBackWithTheNextStep: an AG-UI
// interrupt (its 1.0 outcome, or the legacy CUSTOM event) and an AI SDK
// tool approval request are the step's questions, not a failure; the
// next step gives each answer back in its protocol's shape: AG-UI's
// resume entries, the AI SDK's approval-responded tool part.
func TestAnInterruptIsAQuestionWhoseAnswerGoesBackWithTheNextStep(t *testing.T) {
	t.Parallel()
	outcome := agenttest.JSON(map[string]any{"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "outcome": map[string]any{
		"type": "interrupt", "interrupts": []any{map[string]any{"id": "int_1", "reason": "tool_approval", "message": "May I?", "toolCallId": "call_w",
			"responseSchema": map[string]any{"type": "object"}}},
	}})
	legacy := agenttest.AGUIRun([]string{agenttest.JSON(map[string]any{"type": "CUSTOM", "name": "on_interrupt", "value": "Approve the transfer?"})})
	approval := agenttest.UIStream(agenttest.UIToolCall("call_w", "weather", `{"city":"Lima"}`),
		[]string{agenttest.JSON(map[string]any{"type": "tool-approval-request", "approvalId": "ap_1", "toolCallId": "call_w"})})
	cases := []struct {
		protocol string
		frames   []string
		want     consumer.Question
		answer   json.RawMessage
		calls    int
	}{
		{agent.ProtocolAGUI, agenttest.Frames(agenttest.AGUIText("a", "Checking.", 4), agenttest.AGUIToolCall("call_w", "weather", `{"city":"Lima"}`), []string{outcome}),
			consumer.Question{ID: "int_1", Reason: "tool_approval", Message: "May I?", ToolCallID: "call_w", Tool: "weather", Arguments: json.RawMessage(`{"city":"Lima"}`), ResponseSchema: json.RawMessage(`{"type":"object"}`)},
			json.RawMessage(`{"ok":true}`), 1},
		{agent.ProtocolAGUI, legacy, consumer.Question{Reason: "on_interrupt", Message: "Approve the transfer?"}, nil, 0},
		{agent.ProtocolAISDK, approval, consumer.Question{ID: "ap_1", Reason: "tool_approval", ToolCallID: "call_w", Tool: "weather", Arguments: json.RawMessage(`{"city":"Lima"}`)}, nil, 1},
	}
	for _, c := range cases {
		done := agenttest.AGUIRun(agenttest.AGUIText("b", "Done.", 8))
		if c.protocol == agent.ProtocolAISDK {
			done = agenttest.UIStream(agenttest.UIText("b", "Done.", 8))
		}
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: c.frames}, agenttest.AgentReply{Frames: done})
		x := newExternal(t, c.protocol, srv, nil)
		turn := turnOf("q")
		st, err := stepOnce(context.Background(), x, turn, nil)
		require.NoError(t, err, "%s: a question is not a failure", c.protocol)
		require.Equal(t, []consumer.Question{c.want}, st.Questions)
		require.Len(t, st.Calls, c.calls, "the call of a declared tool is Baton's, which asks the question before it runs it")
		require.Len(t, srv.Requests(), 1, "a question is not retried")

		st.Questions[0].Status, st.Questions[0].Answer = schema.ApprovalApproved, c.answer
		_, err = x.Step(context.Background(), consumer.StepRequest{Turn: &turn, Index: 1, Steps: []consumer.Step{st}, Tools: []consumer.ToolSpec{weatherSpec}})
		require.NoError(t, err)
		next := srv.Requests()[1]
		switch c.protocol {
		case agent.ProtocolAGUI:
			var body struct {
				Resume []map[string]any `json:"resume"`
			}
			next.Decode(t, &body)
			payload := any(map[string]any{"approved": true})
			if c.answer != nil {
				payload = map[string]any{"ok": true}
			}
			require.Equal(t, []map[string]any{{"interruptId": c.want.ID, "status": "resolved", "payload": payload}}, body.Resume)
		case agent.ProtocolAISDK:
			require.Contains(t, string(next.Body), `"state":"approval-responded"`)
			require.Contains(t, string(next.Body), `"approval":{"id":"ap_1","approved":true}`)
			require.Contains(t, string(next.Body), `"toolCallId":"call_w"`)
		}
	}
}

func TestAnEmptyStepIsAnEmptyReply(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step()})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), nil)
		require.ErrorIs(t, err, agent.ErrEmptyReply)
		require.True(t, agent.IsTerminal(err))
		require.Equal(t, 1, st.Requests)
	})
}

func TestAUUIDThreadIDIsAUUIDv5OfTheConversation(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
			return agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))}
		})
		x := newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.ThreadID = agent.ThreadIDUUID })
		threads := map[string]string{}
		for _, conv := range []string{"c_one", "c_two", "c_one"} {
			turn := turnOf("q")
			turn.ConversationID = conv
			_, err := stepOnce(context.Background(), x, turn, nil)
			require.NoError(t, err)
			reqs := srv.Requests()
			body := reqs[len(reqs)-1].Map(t)
			thread, _ := body["threadId"].(string)
			if w.protocol == agent.ProtocolAISDK {
				thread, _ = body["id"].(string)
			}
			id, err := uuid.Parse(thread)
			require.NoError(t, err, "the thread id %q is a UUID", thread)
			require.Equal(t, uuid.Version(5), id.Version())
			require.Equal(t, uuid.NewSHA1(agent.ThreadNamespace, []byte(conv)).String(), thread, "any language computes it again from the namespace")
			if seen, ok := threads[conv]; ok {
				require.Equal(t, seen, thread, "the same conversation is the same thread")
			}
			threads[conv] = thread
		}
		require.NotEqual(t, threads["c_one"], threads["c_two"])
	})
}

// authorizer signs "tokens" that name the step, and records deadlines.
type authorizer struct {
	mu        sync.Mutex
	deadlines []time.Time
}

func (a *authorizer) Authorize(_ context.Context, req consumer.StepRequest, deadline time.Time) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deadlines = append(a.deadlines, deadline)
	return "tok." + req.Key(), nil
}

func TestTheAuthorizersTokenAndTheConfiguredHeadersReachTheAgent(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t,
			agenttest.AgentReply{Status: 502, Body: `{"error":"upstream"}`},
			agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))},
		)
		auth := &authorizer{}
		x := newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) {
			c.Authorizer = auth
			c.Headers = map[string]string{"X-Api-Key": "k-123456", "X-Tenant": "acme"}
		})
		start := time.Now()
		_, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.NoError(t, err)
		key := consumer.StepKey("conv", "turn_test", 0, 0)
		for _, r := range srv.Requests() {
			require.Equal(t, "Bearer tok."+key, r.Header.Get("Authorization"))
			require.Equal(t, "k-123456", r.Header.Get("X-Api-Key"))
			require.Equal(t, "acme", r.Header.Get("X-Tenant"))
			require.Equal(t, key, r.Header.Get("Idempotency-Key"), "a retry has the same key")
		}
		require.Len(t, auth.deadlines, 2, "each request, retries included, gets a token")
		for _, d := range auth.deadlines {
			require.WithinDuration(t, start.Add(10*time.Second), d, 2*time.Second, "the deadline is the end of the request's cap")
		}
		require.Equal(t, srv.URL, x.Audience(), "the audience defaults to the agent's origin")
	})
}

func TestMaxInFlightBoundsTheRequestsInFlightAcrossTurns(t *testing.T) {
	t.Parallel()
	w := wires[0]
	srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
		return agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 1)), FrameDelay: 5 * time.Millisecond}
	})
	x := newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.MaxInFlight = 2 })
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			_, err := stepOnce(context.Background(), x, turnOf("q"), nil)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, srv.Requests(), 6)
	require.LessOrEqual(t, srv.Peak(), 2, "no more requests at once than MaxInFlight")

	// A step that waits for a slot waits only as long as its context.
	held := agenttest.NewAgent(t, agenttest.AgentReply{Hang: true})
	one := newExternal(t, w.protocol, held, func(c *agent.ExternalConfig) { c.MaxInFlight = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := stepOnce(ctx, one, turnOf("q"), nil)
		first <- err
	}()
	testenv.WaitOrTimeout(t, held.Arrived(), 5*time.Second, "the first step's request")
	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	_, err := stepOnce(short, one, turnOf("q"), nil)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the second step gave up waiting for a slot")
	require.Len(t, held.Requests(), 1)
	cancel()
	require.ErrorIs(t, testenv.WaitOrTimeout(t, first, 5*time.Second, "the first step to end"), context.Canceled)
}
