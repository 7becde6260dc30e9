package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
)

// requireSameRequests checks that every post of a step was the same
// request: its body, run id and Idempotency-Key.
func requireSameRequests(t *testing.T, reqs []agenttest.AgentRequest) {
	t.Helper()
	require.Greater(t, len(reqs), 1)
	for i, r := range reqs[1:] {
		require.JSONEq(t, string(reqs[0].Body), string(r.Body), "retry %d posts the same step", i+1)
		require.Equal(t, reqs[0].Header.Get("Idempotency-Key"), r.Header.Get("Idempotency-Key"), "retry %d has the same Idempotency-Key", i+1)
	}
	require.Equal(t, consumer.StepKey("conv", "turn_test", 0, 0), reqs[0].Header.Get("Idempotency-Key"))
}

func TestAFailedRunIsRetriedWithTheSameRunID(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		failed := w.text("a1", "Draft", 5)
		failed = append(failed, w.failure)
		// LangGraph goes on after RUN_ERROR; nothing after it is read.
		failed = append(failed, w.text("a2", "more", 5)...)
		srv := agenttest.NewAgent(t,
			agenttest.AgentReply{Frames: failed},
			agenttest.AgentReply{Frames: w.step(w.text("a1", "Final.", 6))},
		)
		live := &recordLive{}
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), live)
		require.NoError(t, err)
		require.Equal(t, "Final.", st.Text)
		require.Equal(t, 2, st.Requests, "the step counts its retry")
		require.Equal(t, []string{"Draft", "<retry>", "Final."}, live.shown(), "the live reply drops what the failed request showed")
		requireSameRequests(t, srv.Requests())
		if w.protocol == agent.ProtocolAGUI {
			require.Equal(t, srv.Requests()[0].Map(t)["runId"], srv.Requests()[1].Map(t)["runId"])
		}
	})
}

func TestAFailedRunThroughTheRetriesEndsTheAttemptButNotTheTurn(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
			return agenttest.AgentReply{Frames: []string{w.failure}}
		})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.MaxRetries = 2 }), turnOf("q"), nil)
		require.ErrorIs(t, err, agent.ErrAgentFailed)
		require.False(t, consumer.IsTerminal(err), "another attempt may succeed")
		require.Equal(t, 3, st.Requests)
		require.Contains(t, err.Error(), "the model is overloaded", "the operator reads what the agent said")
		require.Contains(t, err.Error(), "3 requests in a row")
		require.Equal(t, "The assistant's agent service failed while answering. Press Retry or send your message again.", userText(t, err))
	})
}

func TestA5xxIsRetried(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t,
			agenttest.AgentReply{Status: 500, Body: `{"error":{"message":"boom"}}`},
			agenttest.AgentReply{Status: 502, Body: `<html>bad gateway</html>`, ContentType: "text/html"},
			agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))},
		)
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), nil)
		require.NoError(t, err)
		require.Equal(t, "ok", st.Text)
		require.Equal(t, 3, st.Requests)
		requireSameRequests(t, srv.Requests())
	})
}

func TestARateLimitWithALongRetryAfterReleasesTheTurnAfterOneRequest(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Status: 429, Header: http.Header{"Retry-After": {"45"}}, Body: `{"error":"slow down"}`})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), nil)
		var rl *agent.RateLimitError
		require.True(t, errors.As(err, &rl), "want a *RateLimitError, got %v", err)
		require.Equal(t, 45*time.Second, rl.RetryAfter(), "the turn runner waits what the agent asked, with the turn released")
		require.ErrorIs(t, err, agent.ErrRateLimited)
		require.False(t, consumer.IsTerminal(err))
		require.Equal(t, 1, st.Requests, "a long wait is not waited inside the step")
		require.Len(t, srv.Requests(), 1)
		require.Contains(t, err.Error(), "asked to wait 45s")
		require.Contains(t, err.Error(), "BATON_AGENT_URL")
		require.Equal(t, "The assistant's agent service is busy. Press Retry or send your message again in a minute.", userText(t, err))
	})
}

func TestAShortRetryAfterIsWaitedInsideTheStep(t *testing.T) {
	t.Parallel()
	w := wires[0]
	srv := agenttest.NewAgent(t,
		agenttest.AgentReply{Status: 429, Header: http.Header{"Retry-After": {"0.1"}}},
		agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))},
	)
	st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), nil)
	require.NoError(t, err)
	require.Equal(t, 2, st.Requests)
	reqs := srv.Requests()
	require.Len(t, reqs, 2)
}

func TestARefusalIsTerminalWithAClearMessage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status int
		body   string
		kind   error
		says   []string
		user   string
	}{
		{400, `{"error":{"message":"messages: required"}}`, agent.ErrAgentRefused,
			[]string{"the agent rejected the step (400 Bad Request: messages: required)", "--agent ag-ui", "BATON_AGENT_URL (--agent-url)"}, "The assistant could not answer because its agent service is not set up correctly. An administrator needs to fix it."},
		{401, `{"error":"bad token"}`, agent.ErrAgentAuth,
			[]string{"refused Baton's credentials (401 Unauthorized)", "audience", "--agent-header"}, "The assistant could not answer because it is not allowed to use its agent service. An administrator needs to fix it."},
		{403, `{"error":"not for you"}`, agent.ErrAgentAuth,
			[]string{"denied Baton access (403 Forbidden: not for you)"}, "The assistant could not answer because it is not allowed to use its agent service. An administrator needs to fix it."},
		{404, `not found`, agent.ErrAgentNotFound,
			[]string{"there is no agent at the agent URL (404 Not Found: not found)", "BATON_AGENT_URL (--agent-url)", "path included"}, "The assistant could not answer because its agent service is not set up correctly. An administrator needs to fix it."},
		{308, ``, agent.ErrAgentRefused,
			[]string{"redirect (308 Permanent Redirect)", "BATON_AGENT_URL (--agent-url)"}, "The assistant could not answer because its agent service is not set up correctly. An administrator needs to fix it."},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.status), func(t *testing.T) {
			t.Parallel()
			reply := agenttest.AgentReply{Status: c.status, Body: c.body, ContentType: "application/json"}
			if c.status == 308 {
				reply.Header = http.Header{"Location": {"/elsewhere"}}
			}
			srv := agenttest.NewAgent(t, reply)
			st, err := stepOnce(context.Background(), newExternal(t, agent.ProtocolAGUI, srv, nil), turnOf("q"), nil)
			require.ErrorIs(t, err, c.kind)
			require.ErrorIs(t, err, agent.ErrAgentRefused, "every refusal is also ErrAgentRefused")
			require.True(t, consumer.IsTerminal(err), "another attempt would be refused too")
			require.Equal(t, 1, st.Requests, "a refusal is not retried")
			for _, s := range c.says {
				require.Contains(t, err.Error(), s)
			}
			require.Equal(t, c.user, userText(t, err))
			require.NotContains(t, err.Error(), srv.URL+"/agent", "the URL is never printed (its origin is the audience, which may be)")
			var me *agent.ModelError
			require.True(t, errors.As(err, &me))
			require.Equal(t, c.status, me.StatusCode)
		})
	}
}

func TestAMalformedAnswerIsTerminal(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("x", 100)
	cases := []struct {
		name     string
		protocol string
		reply    agenttest.AgentReply
		says     string
	}{
		{"json instead of events", agent.ProtocolAGUI, agenttest.AgentReply{ContentType: "application/json", Body: `{"messages":[]}`}, `it answered with "application/json" instead of server-sent events`},
		{"html served as events", agent.ProtocolAISDK, agenttest.AgentReply{Body: "<html>\n<body>" + huge + "</body></html>\n"}, "the answer is not server-sent events"},
		{"a frame that is not json", agent.ProtocolAGUI, agenttest.AgentReply{Frames: []string{"RUN_STARTED"}}, "an event is not a JSON object"},
		{"a chunk that is not json", agent.ProtocolAISDK, agenttest.AgentReply{Frames: []string{"{text"}}, "a chunk is not a JSON object"},
		{"an event without a type", agent.ProtocolAGUI, agenttest.AgentReply{Frames: []string{`{"delta":"hi"}`}}, "an event has no type"},
		{"arguments of a call never started", agent.ProtocolAGUI, agenttest.AgentReply{Frames: []string{`{"type":"TOOL_CALL_ARGS","toolCallId":"c9","delta":"{}"}`}}, `TOOL_CALL_ARGS for tool call "c9", which no TOOL_CALL_START opened`},
		{"a call without its tool's name", agent.ProtocolAGUI, agenttest.AgentReply{Frames: []string{`{"type":"TOOL_CALL_START","toolCallId":"c9"}`}}, "a TOOL_CALL_START event has no toolCallName"},
		{"a delta of the wrong type", agent.ProtocolAISDK, agenttest.AgentReply{Frames: []string{`{"type":"text-delta","id":"t","delta":5}`}}, "a text-delta chunk does not have the fields of one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := agenttest.NewAgent(t, c.reply)
			st, err := stepOnce(context.Background(), newExternal(t, c.protocol, srv, nil), turnOf("q"), nil)
			require.ErrorIs(t, err, agent.ErrAgentMalformed)
			require.True(t, consumer.IsTerminal(err))
			require.Equal(t, 1, st.Requests, "a malformed answer is not retried")
			require.Contains(t, err.Error(), c.says)
			require.Contains(t, err.Error(), "BATON_AGENT_URL (--agent-url)")
			require.Contains(t, err.Error(), "--agent "+c.protocol)
			require.Equal(t, "The assistant could not answer because it could not read its agent service's answers. An administrator needs to fix it.", userText(t, err))
		})
	}
}

func TestADroppedStreamIsRetried(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		whole := w.step(w.text("a", "Whole answer.", 3))
		srv := agenttest.NewAgent(t,
			// The connection drops mid-answer.
			agenttest.AgentReply{Frames: whole, CutAfter: 4},
			// The answer ends without the step's end.
			agenttest.AgentReply{Frames: whole[:len(whole)-2]},
			agenttest.AgentReply{Frames: whole},
		)
		live := &recordLive{}
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, nil), turnOf("q"), live)
		require.NoError(t, err)
		require.Equal(t, "Whole answer.", st.Text)
		require.Equal(t, 3, st.Requests)
		requireSameRequests(t, srv.Requests())
		shown := live.shown()
		require.Contains(t, shown, "<retry>", "each retry resets the live reply")
		require.Equal(t, "Whole answer.", lastAttempt(shown), "after the last reset the live reply is the answer")
	})
}

// lastAttempt is what the live reply shows after its last reset.
func lastAttempt(shown []string) string {
	var out string
	for _, s := range shown {
		if s == "<retry>" {
			out = ""
			continue
		}
		out += s
	}
	return out
}

func TestADroppedStreamThroughTheRetriesEndsTheAttempt(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
			return agenttest.AgentReply{Frames: w.text("a", "Cut", 3)}
		})
		st, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.MaxRetries = 1 }), turnOf("q"), nil)
		require.ErrorIs(t, err, agent.ErrAgentUnavailable)
		require.False(t, consumer.IsTerminal(err))
		require.Equal(t, 2, st.Requests)
		require.Contains(t, err.Error(), "the stream ended before the step did")
	})
}

func TestNoProgressIsATimeoutRetriedInsideTheStep(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		whole := w.step(w.text("a", "Late but whole.", 4))
		srv := agenttest.NewAgent(t,
			// Nothing after the headers.
			agenttest.AgentReply{Frames: whole, FirstByteDelay: 10 * time.Second},
			// Not even the headers.
			agenttest.AgentReply{Hang: true},
			// A stream that stalls.
			agenttest.AgentReply{Frames: whole, StallAfter: 2},
			agenttest.AgentReply{Frames: whole},
		)
		x := newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) {
			c.FirstByteTimeout = 150 * time.Millisecond
			c.IdleTimeout = 150 * time.Millisecond
		})
		started := time.Now()
		st, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.NoError(t, err)
		require.Equal(t, "Late but whole.", st.Text)
		require.Equal(t, 4, st.Requests)
		require.Less(t, time.Since(started), 5*time.Second, "no wait longer than its timeout")
		for range 3 {
			testenv.WaitOrTimeout(t, srv.Gone(), 5*time.Second, "the agent to see each request that timed out aborted")
		}
	})
}

func TestNoProgressThroughTheRetriesIsAnAgentTimeout(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
		return agenttest.AgentReply{Frames: agenttest.AGUIRun(agenttest.AGUIText("a", "slow", 1)), StallAfter: 1}
	})
	x := newExternal(t, agent.ProtocolAGUI, srv, func(c *agent.ExternalConfig) {
		c.IdleTimeout = 100 * time.Millisecond
		c.MaxRetries = 1
	})
	st, err := stepOnce(context.Background(), x, turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentTimeout)
	require.False(t, consumer.IsTerminal(err), "another attempt may succeed")
	require.Equal(t, 2, st.Requests)
	require.Contains(t, err.Error(), "nothing arrived for 100ms")
	require.Contains(t, err.Error(), "BATON_AGENT_IDLE_TIMEOUT, --agent-idle-timeout")
	require.Equal(t, "The assistant's agent service stopped responding. Press Retry or send your message again.", userText(t, err))
}

func TestTheCapEndsARequestThatNeverFinishes(t *testing.T) {
	t.Parallel()
	// A stream that keeps sending but never ends the step.
	frames := make([]string, 200)
	for i := range frames {
		frames[i] = agenttest.JSON(map[string]any{"type": "STATE_DELTA", "delta": []any{}})
	}
	srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
		return agenttest.AgentReply{Frames: frames, FrameDelay: 10 * time.Millisecond}
	})
	x := newExternal(t, agent.ProtocolAGUI, srv, func(c *agent.ExternalConfig) {
		c.Timeout = 200 * time.Millisecond
		c.MaxRetries = -1
	})
	_, err := stepOnce(context.Background(), x, turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentTimeout)
	require.Contains(t, err.Error(), "still running after 200ms")
	require.Contains(t, err.Error(), "BATON_AGENT_TIMEOUT, --agent-timeout")
}

func TestMaxStepBytesBoundsWhatIsRead(t *testing.T) {
	t.Parallel()
	t.Run("large skipped events within the limit", func(t *testing.T) {
		t.Parallel()
		frames := agenttest.AGUIRun([]string{agenttest.AGUIRaw(200 << 10), agenttest.AGUIRaw(200 << 10)}, agenttest.AGUIText("a", "ok", 2))
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: frames})
		st, err := stepOnce(context.Background(), newExternal(t, agent.ProtocolAGUI, srv, nil), turnOf("q"), nil)
		require.NoError(t, err)
		require.Equal(t, "ok", st.Text)
	})
	t.Run("past the limit", func(t *testing.T) {
		t.Parallel()
		raw := make([]string, 10)
		for i := range raw {
			raw[i] = agenttest.AGUIRaw(20 << 10)
		}
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: agenttest.AGUIRun(agenttest.AGUIText("a", "ok", 2), raw)})
		x := newExternal(t, agent.ProtocolAGUI, srv, func(c *agent.ExternalConfig) { c.MaxStepBytes = 64 << 10 })
		st, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.ErrorIs(t, err, agent.ErrStepTooLarge)
		require.True(t, consumer.IsTerminal(err))
		require.Equal(t, 1, st.Requests)
		require.Contains(t, err.Error(), "longer than 65536 bytes")
		require.Contains(t, err.Error(), "BATON_AGENT_MAX_STEP_BYTES, --agent-max-step-bytes")
		require.NotContains(t, userText(t, err), "BATON")
	})
}

func TestMaxToolCallsBoundsTheCallsOfAStep(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(
			w.call("c1", "weather", `{"city":"A"}`), w.call("c2", "weather", `{"city":"B"}`),
			// The agent's own tools do not count.
			w.call("own", "search", `{}`), w.output("own", "x"),
			w.call("c3", "weather", `{"city":"C"}`),
		)})
		x := newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.MaxToolCalls = 2 })
		st, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.ErrorIs(t, err, agent.ErrTooManyToolCalls)
		require.True(t, consumer.IsTerminal(err))
		require.Equal(t, 1, st.Requests)
		require.Contains(t, err.Error(), "more than 2 tool calls in one step")
		require.Contains(t, err.Error(), "BATON_AGENT_MAX_TOOL_CALLS, --agent-max-tool-calls")

		srv = agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(w.call("c1", "weather", `{"city":"A"}`), w.call("c2", "weather", `{"city":"B"}`))})
		st, err = stepOnce(context.Background(), newExternal(t, w.protocol, srv, func(c *agent.ExternalConfig) { c.MaxToolCalls = 2 }), turnOf("q"), nil)
		require.NoError(t, err)
		require.Len(t, st.Calls, 2, "up to the limit is fine")
	})
}

func TestAStopAbortsTheOpenRequest(t *testing.T) {
	eachWire(t, func(t *testing.T, w wire) {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(w.text("a", "a long answer that goes on", 3)), StallAfter: 3})
		x := newExternal(t, w.protocol, srv, nil)
		ctx, stop := context.WithCancelCause(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := stepOnce(ctx, x, turnOf("q"), nil)
			done <- err
		}()
		srv.WaitFrames(t, 3, 5*time.Second)
		stopped := time.Now()
		stop(consumer.ErrStopped)
		err := testenv.WaitOrTimeout(t, done, 5*time.Second, "the step to return after the stop")
		require.ErrorIs(t, err, consumer.ErrStopped, "the step returns the stop's cause")
		testenv.WaitOrTimeout(t, srv.Gone(), 5*time.Second, "the agent to see the request aborted")
		require.Less(t, time.Since(stopped), 2*time.Second, "the request is aborted at once, not at a timeout")
		require.Len(t, srv.Requests(), 1, "a stopped step is not retried")
	})
}

func TestAToolInputErrorIsACallTheTurnRunnerAnswers(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewAgent(t,
		agenttest.AgentReply{Frames: agenttest.UIStream([]string{
			agenttest.JSON(map[string]any{"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"}),
			agenttest.JSON(map[string]any{"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": "{city: Lima"}),
			agenttest.JSON(map[string]any{"type": "tool-input-error", "toolCallId": "c1", "toolName": "weather", "input": "{city: Lima", "errorText": "JSON parse error"}),
		})},
		agenttest.AgentReply{Frames: agenttest.UIStream(agenttest.UIText("t", "Sorry.", 3))},
	)
	ex := newExecutor(weatherRegistry())
	reply, err := run(context.Background(), newExternal(t, agent.ProtocolAISDK, srv, nil), turnOf("Lima?"), ex)
	require.NoError(t, err)
	require.Equal(t, "Sorry.", reply.Content)
	require.Empty(t, ex.called(), "arguments that are not JSON do not run")
	var second struct {
		Messages []struct {
			Parts []map[string]any `json:"parts"`
		} `json:"messages"`
	}
	srv.Requests()[1].Decode(t, &second)
	part := second.Messages[len(second.Messages)-1].Parts[1]
	require.Equal(t, "output-error", part["state"])
	require.Equal(t, "{city: Lima", part["input"], "the input as the agent's model wrote it")
	require.NotEmpty(t, part["errorText"], "the turn runner's check answered the call")
}

func TestEachKindOfAgentFailureHasItsOwnMetricReason(t *testing.T) {
	t.Parallel()
	kinds := []error{agent.ErrAgentRefused, agent.ErrAgentAuth, agent.ErrAgentNotFound, agent.ErrAgentMalformed,
		agent.ErrAgentUnavailable, agent.ErrAgentTimeout, agent.ErrAgentFailed, agent.ErrStepTooLarge, agent.ErrTooManyToolCalls,
		agent.ErrModelUnavailable, agent.ErrModelTimeout, agent.ErrModelRefused, agent.ErrRateLimited, agent.ErrEmptyReply}
	seen := map[string]error{}
	for _, k := range kinds {
		var r consumer.FailureReasoner = &agent.ModelError{Kind: k, Message: "m"}
		reason := r.FailureReason()
		require.Regexp(t, `^[a-z_]{1,32}$`, reason)
		require.NotEqual(t, "model_other", reason, "%v has no reason of its own", k)
		require.NotContains(t, seen, reason, "%v and %v share a reason", k, seen[reason])
		seen[reason] = k
	}
}
