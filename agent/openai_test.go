package agent_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/schema"
)

func TestRunSendsHistoryToolsAndTurnAndReturnsTheReply(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, agenttest.Response{Content: "It is sunny in Paris."})
		var n int
		var mu sync.Mutex
		a := newAgent(t, srv, func(c *agent.Config) {
			c.DisableStreaming = !streaming
			c.SystemPrompt = "Be brief."
		})
		history := []schema.Message{
			{Role: schema.RoleUser, Content: "hello"},
			{Role: schema.RoleAssistant, Content: "hi"},
			{Role: schema.RoleUser, Content: "are you there?"},
			{Role: schema.RoleError, Content: "The assistant could not answer after 3 attempts"},
		}
		reply, err := run(context.Background(), a, turnOf("weather in Paris?", history...), newExecutor(agent.NewRegistry(weather(&n, &mu))))
		require.NoError(t, err)
		require.Equal(t, "It is sunny in Paris.", reply.Content)

		reqs := srv.Requests()
		require.Len(t, reqs, 1)
		req := reqs[0]
		require.Equal(t, "test-model", req.Model)
		require.Equal(t, streaming, req.Stream)
		require.Equal(t, "Bearer sk-test", req.Header.Get("Authorization"))
		require.Equal(t, "system user assistant user user", req.Roles(), "the error message of a failed turn must not be sent as the model's words")
		require.Equal(t, "hi", req.Messages[2].Text())
		require.Equal(t, "weather in Paris?", req.LastUser())
		require.Len(t, req.Tools, 1)
		require.Equal(t, "weather", req.Tools[0].Function.Name)
		require.Equal(t, "Current weather of a city.", req.Tools[0].Function.Description)
		require.Equal(t, []any{"city"}, req.Tools[0].Function.Parameters["required"])
	})
}

func TestToolCallsRunEvenWhenFinishReasonIsStop(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t,
			agenttest.Response{FinishReason: "stop", ToolCalls: []agenttest.ToolCall{{ID: "call_a", Name: "weather", Arguments: `{"city":"Oslo"}`}}},
			agenttest.Response{Content: "Sunny in Oslo."},
		)
		var n int
		var mu sync.Mutex
		reg := agent.NewRegistry(weather(&n, &mu))
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		ex := newExecutor(reg)
		reply, err := run(context.Background(), a, turnOf("weather?"), ex)
		require.NoError(t, err)
		require.Equal(t, "Sunny in Oslo.", reply.Content)
		require.Equal(t, 1, n, "the tool call sent with finish_reason stop must run once")
		require.Len(t, ex.called(), 1)
		require.JSONEq(t, `{"city":"Oslo"}`, string(ex.called()[0].Arguments))

		reqs := srv.Requests()
		require.Len(t, reqs, 2)
		require.Equal(t, "user assistant tool", reqs[1].Roles())
		require.Equal(t, "call_a", reqs[1].Messages[1].ToolCalls[0].ID)
		require.Equal(t, `sunny in {"city":"Oslo"}`, reqs[1].ToolMessages()["call_a"])
	})
}

func TestBrokenToolArgumentsGoBackToTheModelAndTheTurnFinishes(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t,
			agenttest.Response{ToolCalls: []agenttest.ToolCall{
				{ID: "call_broken", Name: "weather", Arguments: `{"city": "Par`},
				{ID: "call_wrong", Name: "weather", Arguments: `{"city": 75}`},
				{ID: "call_unknown", Name: "forecast", Arguments: `{}`},
			}},
			agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_ok", Name: "weather", Arguments: `{"city":"Paris"}`}}},
			agenttest.Response{Content: "Sunny in Paris."},
		)
		var n int
		var mu sync.Mutex
		reg := agent.NewRegistry(weather(&n, &mu))
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		ex := newExecutor(reg)
		reply, err := run(context.Background(), a, turnOf("weather?"), ex)
		require.NoError(t, err, "a tool error goes to the model, not to the user")
		require.Equal(t, "Sunny in Paris.", reply.Content)
		require.Equal(t, 1, n, "only the call with valid arguments may run")
		require.Len(t, ex.called(), 1, "calls with invalid arguments must not reach the executor, so nothing is journaled for them")

		reqs := srv.Requests()
		require.Len(t, reqs, 3)
		results := reqs[1].ToolMessages()
		require.Contains(t, results["call_broken"], "not valid JSON")
		require.Contains(t, results["call_wrong"], "do not match the schema")
		require.Contains(t, results["call_unknown"], `there is no tool "forecast"`)
		require.Equal(t, "{}", reqs[1].Messages[1].ToolCalls[0].Function.Arguments, "broken arguments are repeated to the model as {}")
	})
}

func TestRetryAfterIsHonoredThen429Succeeds(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t,
			agenttest.Response{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}, Body: `{"error":{"message":"slow down","type":"rate_limit"}}`},
			agenttest.Response{Content: "done"},
		)
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		reply, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		require.Equal(t, "done", reply.Content)
		reqs := srv.Requests()
		require.Len(t, reqs, 2, "the client must not retry on its own: one request per retry of the agent")
		gap := reqs[1].At.Sub(reqs[0].At)
		require.GreaterOrEqual(t, gap, time.Second, "the retry came %s after the 429, before its Retry-After of 1s", gap)
	})
}

func TestServerErrorsAreRetriedWithBackoffThenGiveUpRetryably(t *testing.T) {
	t.Parallel()
	fail := agenttest.Response{Status: http.StatusBadGateway, Body: `{"error":{"message":"upstream"}}`}
	srv := agenttest.NewServer(t, fail, fail, agenttest.Response{Content: "ok"})
	a := newAgent(t, srv, nil)
	reply, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	require.Equal(t, "ok", reply.Content)

	require.Len(t, srv.Requests(), 3)

	srv = agenttest.NewServer(t, fail, fail)
	a = newAgent(t, srv, func(c *agent.Config) { c.MaxRetries = 1 })
	_, err = run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.ErrorIs(t, err, agent.ErrModelUnavailable)
	require.False(t, agent.IsTerminal(err), "an unavailable server must leave the turn to another attempt")
	require.Equal(t, "the model server failed on 2 calls in a row in this attempt (last: 502 Bad Gateway: upstream): "+checkServer, err.Error(), "the text counts the calls that were made")
	require.Len(t, srv.Requests(), 2)
}

func TestAStreamCutShortIsRetried(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]agenttest.Response{
		"connection dropped": {Content: "Hello there, world", CutAfter: 2},
		"error event":        {Content: "Hello there, world", ErrorAfter: 2},
		"no finish reason":   {Content: "Hello there, world", FinishReason: "-"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := agenttest.NewServer(t, first, agenttest.Response{Content: "Hello again, world"})
			a := newAgent(t, srv, nil)
			reply, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
			require.NoError(t, err)
			require.Equal(t, "Hello again, world", reply.Content, "text of a cut stream must not leak into the reply")
			require.Len(t, srv.Requests(), 2)
		})
	}
}

func TestTheTurnBudgetStopsAModelThatKeepsCallingTools(t *testing.T) {
	t.Parallel()
	call := func(id string) agenttest.Response {
		return agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: id, Name: "weather", Arguments: `{"city":"Rome"}`}}}
	}
	srv := agenttest.NewServer(t, call("c1"), call("c2"), call("c3"))
	var n int
	var mu sync.Mutex
	reg := agent.NewRegistry(weather(&n, &mu))
	a := newAgent(t, srv, nil)
	ex := newExecutor(reg)
	ex.maxTools = 2
	_, err := run(context.Background(), a, turnOf("loop"), ex)
	require.ErrorIs(t, err, consumer.ErrToolIterations)
	require.True(t, consumer.IsTerminal(err))
	require.Equal(t, "the agent was still calling tools after 2 steps, the most a turn may use (BATON_MAX_TOOL_ITERATIONS, --max-tool-iterations): raise it if turns need more", err.Error())
	require.Equal(t, userToolRounds, userText(t, err))
	require.Equal(t, 2, n)

	srv = agenttest.NewServer(t, agenttest.Response{Status: 500}, agenttest.Response{Status: 500})
	a = newAgent(t, srv, func(c *agent.Config) { c.MaxModelCalls = 2 })
	_, err = run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.ErrorIs(t, err, agent.ErrBudgetExceeded)
	require.Equal(t, "the turn made all 2 model calls it may make (BATON_MAX_MODEL_CALLS, --max-model-calls); the last one failed: 500 Internal Server Error", err.Error())
	require.Len(t, srv.Requests(), 2, "retries count against the model call budget")
}

func TestRepeatedOrMissingToolCallIDsGetUniqueOnes(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewServer(t,
		agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "", Name: "weather", Arguments: `{"city":"A"}`}, {ID: "call_0", Name: "weather", Arguments: `{"city":"B"}`}}},
		agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_0", Name: "weather", Arguments: `{"city":"C"}`}}},
		agenttest.Response{Content: "done"},
	)
	var n int
	var mu sync.Mutex
	reg := agent.NewRegistry(weather(&n, &mu))
	a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = true })
	ex := newExecutor(reg)
	_, err := run(context.Background(), a, turnOf("go"), ex)
	require.NoError(t, err)
	ids := map[string]bool{}
	for _, c := range ex.called() {
		require.NotEmpty(t, c.ID)
		require.False(t, ids[c.ID], "tool call ID %q given to the journal twice in one run", c.ID)
		ids[c.ID] = true
	}
	require.Len(t, ids, 3)
	// The model sees the IDs the journal saw.
	third := srv.Requests()[2]
	for id := range third.ToolMessages() {
		require.True(t, ids[id], "tool result %q does not match a journaled call", id)
	}
}

func TestConfigValidateNamesTheSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   agent.Config
		field string
		value any
	}{
		{agent.Config{Model: "m", BaseURL: "localhost:8000"}, "BaseURL", "(not shown)"},
		{agent.Config{}, "Model", `""`},
		{agent.Config{Model: "m", MaxModelCalls: -1}, "MaxModelCalls", -1},
		{agent.Config{Model: "m", RequestTimeout: -time.Second}, "RequestTimeout", -time.Second},
		{agent.Config{Model: "m", FirstByteTimeout: -time.Second}, "FirstByteTimeout", -time.Second},
		{agent.Config{Model: "m", IdleTimeout: -time.Second}, "IdleTimeout", -time.Second},
		{agent.Config{Model: "m", ContextTokens: -1}, "ContextTokens", -1},
		{agent.Config{Model: "m", ContextTokens: 900}, "ContextTokens", 900},
		{agent.Config{Model: "m", SystemPrompt: strings.Repeat("be brief ", 12000)}, "ContextTokens", agent.DefaultContextTokens},
		{agent.Config{Model: "m", MaxToolResultBytes: 10}, "MaxToolResultBytes", 10},
	} {
		err := tc.cfg.WithDefaults().Validate()
		var se *setting.Error
		require.True(t, errors.As(err, &se), "%v should be a *setting.Error", err)
		require.Equal(t, tc.field, se.Field)
		require.Equal(t, tc.value, se.Value)
		require.NotEmpty(t, se.Problem)
	}
	cfg := agent.Config{Model: "m"}.WithDefaults()
	require.NoError(t, cfg.Validate())
	require.Equal(t, agent.DefaultBaseURL, cfg.BaseURL)
	require.Equal(t, agent.DefaultMaxModelCalls, cfg.MaxModelCalls)
	require.Equal(t, 10*time.Minute, cfg.RequestTimeout, "the cap of one call, long by default: calls are judged by their progress")
	require.Equal(t, time.Minute, cfg.FirstByteTimeout)
	require.Equal(t, 30*time.Second, cfg.IdleTimeout)
	require.Equal(t, 32000, cfg.ContextTokens)
	require.Equal(t, 16384, cfg.MaxToolResultBytes)
	require.Equal(t, 2*time.Second, cfg.MaxInlineRetryAfter)
}
