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
)

// The texts users read, whole: they name no setting, flag, server or
// secret.
const (
	userSetup       = "The assistant could not answer because its model service is not set up correctly. An administrator needs to fix it."
	userAuth        = "The assistant could not answer because it is not allowed to use its model. An administrator needs to fix it."
	userNotFound    = "The assistant could not answer because its model is not available. An administrator needs to fix it."
	userTooLong     = "The assistant could not answer because this conversation does not fit its model. An administrator needs to fix it."
	userMalformed   = "The assistant could not answer because it could not read its model service's answers. An administrator needs to fix it."
	userFiltered    = "The model declined to answer this message because of its content policy. Try rephrasing it."
	userEmpty       = "The model gave an empty answer. Try rephrasing your message."
	userTruncated   = "The model ran out of room before it wrote anything. Try asking for less at a time."
	userBusy        = "The assistant's model is busy. Press Retry or send your message again in a minute."
	userUnavailable = "The assistant's model service is not responding. Press Retry or send your message again later."
	userTimeout     = "The assistant's model stopped responding. Press Retry or send your message again."
	userToolRounds  = "The assistant needed too many steps for this message and stopped. Try asking for less at a time."
	userModelCalls  = "The assistant made too many model calls for this message and stopped. Press Retry or send your message again."
)

// The operators' texts end with what to check; these are the common
// endings.
const (
	checkServer   = "check that it is up and not overloaded at BATON_MODEL_BASE_URL (--model-base-url)"
	checkLimits   = "if this persists, check the limits of the key in BATON_MODEL_API_KEY (--model-api-key) and the capacity of the server at BATON_MODEL_BASE_URL (--model-base-url)"
	checkProtocol = "check that BATON_MODEL_BASE_URL (--model-base-url) is the API root of an OpenAI-compatible server"
	checkStream   = checkProtocol + ", or set --model-streaming=false (BATON_MODEL_STREAMING=false) if it cannot stream"
)

// fault is one fault of the model edge and what the agent must make of it.
type fault struct {
	name   string
	script []agenttest.Response
	// dated builds the script when the subtest runs, for a date that must
	// be fresh.
	dated func() []agenttest.Response
	// modes: "streamed", "whole" or both when empty.
	mode   string
	change func(*agent.Config)
	// kind is the sentinel the error matches; terminal and retryAfter its
	// classification (retryAfter < 0: not a RetryAfterError).
	kind       error
	terminal   bool
	retryAfter time.Duration
	calls      int
	user       string
	// operator is the whole Error() text; for a wait the server did not
	// fix, operatorf formats it with the RetryAfter the error reports.
	operator  string
	operatorf string
}

func errorBody(message, typ, code string) string {
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"code":%q}}`, message, typ, code)
}

func status(code int, body string, header ...string) agenttest.Response {
	r := agenttest.Response{Status: code, Body: body}
	if len(header) == 2 {
		r.Header = http.Header{header[0]: {header[1]}}
	}
	return r
}

func faults() []fault {
	notJSON := agenttest.Response{Body: `<html>hello</html>`}
	upstream := status(http.StatusBadGateway, errorBody("upstream", "server_error", ""))
	return []fault{
		{
			name:     "400 wrong request names the model in its place",
			script:   []agenttest.Response{status(400, errorBody("'messages' must contain at least one message", "invalid_request_error", ""))},
			kind:     agent.ErrModelRefused,
			terminal: true, retryAfter: -1, calls: 1, user: userSetup,
			operator: `the model server rejected the request (400 Bad Request: 'messages' must contain at least one message): check that model "test-model" (BATON_MODEL, --model) supports chat with tools, and BATON_MODEL_BASE_URL (--model-base-url)`,
		},
		{
			name:     "400 tools not supported",
			script:   []agenttest.Response{status(400, errorBody("registry.ollama.ai/library/gemma:2b does not support tools", "api_error", ""))},
			kind:     agent.ErrUnsupported,
			terminal: true, retryAfter: -1, calls: 1, user: userSetup,
			operator: `model "test-model" does not support tool calls (400 Bad Request: registry.ollama.ai/library/gemma:2b does not support tools): choose a model that does (BATON_MODEL, --model)`,
		},
		{
			name:     "400 streaming not supported",
			script:   []agenttest.Response{status(400, errorBody("stream is not supported by this backend", "invalid_request_error", ""))},
			kind:     agent.ErrUnsupported,
			terminal: true, retryAfter: -1, calls: 1, user: userSetup,
			operator: `the model server does not support streaming for model "test-model" (400 Bad Request: stream is not supported by this backend): set --model-streaming=false (BATON_MODEL_STREAMING=false)`,
		},
		{
			name:     "501 not implemented",
			script:   []agenttest.Response{status(501, `{"detail":"Not Implemented"}`)},
			kind:     agent.ErrUnsupported,
			terminal: true, retryAfter: -1, calls: 1, user: userSetup,
			operator: `the model server does not implement this request (501 Not Implemented: Not Implemented): check that BATON_MODEL_BASE_URL (--model-base-url) is the API root of a server with chat completions, and model "test-model" (BATON_MODEL, --model) supports chat with tools`,
		},
		{
			name:     "400 context length exceeded",
			script:   []agenttest.Response{status(400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`)},
			kind:     agent.ErrContextTooLong,
			terminal: true, retryAfter: -1, calls: 1, user: userTooLong,
			operator: `the request exceeds what model "test-model" can take (400 Bad Request: This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.): lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens, now 32000) below its context window`,
		},
		{
			name:     "400 content filter on the prompt",
			script:   []agenttest.Response{status(400, errorBody("The response was filtered due to the prompt triggering the content management policy.", "", "content_filter"))},
			kind:     agent.ErrContentFiltered,
			terminal: true, retryAfter: -1, calls: 1, user: userFiltered,
			operator: `the model server's content filter refused the request (400 Bad Request: The response was filtered due to the prompt triggering the content management policy.); another attempt would be refused too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)`,
		},
		{
			name:     "401 never quotes the key",
			script:   []agenttest.Response{status(401, errorBody("Incorrect API key provided: sk-te***st", "invalid_request_error", "invalid_api_key"))},
			kind:     agent.ErrModelAuth,
			terminal: true, retryAfter: -1, calls: 1, user: userAuth,
			operator: `the model server refused the API key (401 Unauthorized): check BATON_MODEL_API_KEY (--model-api-key)`,
		},
		{
			name:     "403 with the key echoed is redacted",
			script:   []agenttest.Response{status(403, errorBody("key sk-test may not use model test-model", "permission_error", ""))},
			kind:     agent.ErrModelAuth,
			terminal: true, retryAfter: -1, calls: 1, user: userAuth,
			operator: `the model server denied access to model "test-model" (403 Forbidden: key [key] may not use model test-model): check that the key in BATON_MODEL_API_KEY (--model-api-key) may use it, and BATON_MODEL (--model)`,
		},
		{
			name:     "404 missing model",
			script:   []agenttest.Response{status(404, errorBody("The model `test-model` does not exist", "invalid_request_error", "model_not_found"))},
			kind:     agent.ErrModelNotFound,
			terminal: true, retryAfter: -1, calls: 1, user: userNotFound,
			operator: "the model server has no model \"test-model\" or no chat completions endpoint (404 Not Found: The model `test-model` does not exist): check BATON_MODEL (--model), and BATON_MODEL_BASE_URL (--model-base-url), which usually ends in /v1",
		},
		{
			name:     "404 page of a wrong base URL",
			script:   []agenttest.Response{{Status: 404, ContentType: "text/html", Body: "<html><body><h1>Not Found</h1></body></html>"}},
			kind:     agent.ErrModelNotFound,
			terminal: true, retryAfter: -1, calls: 1, user: userNotFound,
			operator: `the model server has no model "test-model" or no chat completions endpoint (404 Not Found: Not Found): check BATON_MODEL (--model), and BATON_MODEL_BASE_URL (--model-base-url), which usually ends in /v1`,
		},
		{
			name:     "finish reason content_filter",
			script:   []agenttest.Response{{Content: "Here is how to", FinishReason: "content_filter"}},
			kind:     agent.ErrContentFiltered,
			terminal: true, retryAfter: -1, calls: 1, user: userFiltered,
			operator: `the model stopped its answer for its content filter (finish reason "content_filter"); another attempt would be filtered too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)`,
		},
		{
			name:     "content filter error event mid-stream",
			mode:     "streamed",
			script:   []agenttest.Response{{StreamBody: "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Here\"}}]}\n\ndata: {\"error\":{\"message\":\"output blocked\",\"code\":\"content_filter\"}}\n\n"}},
			kind:     agent.ErrContentFiltered,
			terminal: true, retryAfter: -1, calls: 1, user: userFiltered,
			operator: `the model server's content filter stopped the answer (an error event in the stream: output blocked); another attempt would be filtered too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)`,
		},
		{
			name:     "empty answer",
			script:   []agenttest.Response{{Content: ""}},
			kind:     agent.ErrEmptyReply,
			terminal: true, retryAfter: -1, calls: 1, user: userEmpty,
			operator: `the model returned an empty answer (finish reason "stop", no text, no tool call); another attempt would likely do the same: check that model "test-model" (BATON_MODEL, --model) is a chat model`,
		},
		{
			name:     "cut off at the output limit inside a tool call, before any text",
			script:   []agenttest.Response{{FinishReason: "length", ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "weather", Arguments: `{"city":"Par`}}}},
			kind:     agent.ErrTruncated,
			terminal: true, retryAfter: -1, calls: 1, user: userTruncated,
			operator: `the model reached its output limit (finish reason "length") before it wrote any text (it was writing a tool call, which did not run): raise the model server's output token limit, or lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens) to leave more of the context window for the answer`,
		},
		{
			name:     "429 with Retry-After 45 ends the attempt at once",
			script:   []agenttest.Response{status(429, errorBody("Rate limit reached for requests", "requests", "rate_limit_exceeded"), "Retry-After", "45")},
			kind:     agent.ErrRateLimited,
			terminal: false, retryAfter: 45 * time.Second, calls: 1, user: userBusy,
			operator: "the model server is busy (429 Too Many Requests: Rate limit reached for requests, on 1 call in this attempt) and asked to wait 45s: the turn is to be tried again after that; " + checkLimits,
		},
		{
			name: "529 with Retry-After as an HTTP date",
			dated: func() []agenttest.Response {
				return []agenttest.Response{status(529, errorBody("Overloaded", "overloaded_error", ""), "Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat))}
			},
			kind:     agent.ErrRateLimited,
			terminal: false, retryAfter: 90 * time.Second, calls: 1, user: userBusy,
			operatorf: "the model server is busy (529 Overloaded: Overloaded, on 1 call in this attempt) and asked to wait %s: the turn is to be tried again after that; " + checkLimits,
		},
		{
			name:     "503 without Retry-After asks for a backoff",
			script:   []agenttest.Response{status(503, errorBody("busy", "server_error", ""))},
			kind:     agent.ErrRateLimited,
			terminal: false, retryAfter: 2 * time.Second, calls: 1, user: userBusy,
			operatorf: "the model server is busy (503 Service Unavailable: busy, on 1 call in this attempt) and sent no Retry-After: the turn is to be tried again in %s (backoff for attempt 1); " + checkLimits,
		},
		{
			name: "429 with a short Retry-After is waited inside the attempt, then handed on",
			script: []agenttest.Response{
				status(429, errorBody("slow down", "requests", ""), "Retry-After", "0.2"),
				status(429, errorBody("slow down", "requests", ""), "Retry-After", "0.2"),
			},
			change:   func(c *agent.Config) { c.MaxRetries = 1 },
			kind:     agent.ErrRateLimited,
			terminal: false, retryAfter: 200 * time.Millisecond, calls: 2, user: userBusy,
			operator: "the model server is busy (429 Too Many Requests: slow down, on 2 calls in a row in this attempt) and asked to wait 200ms: the turn is to be tried again after that; " + checkLimits,
		},
		{
			name:     "502 retried with backoff, the calls counted",
			script:   []agenttest.Response{upstream, upstream, upstream, upstream},
			kind:     agent.ErrModelUnavailable,
			terminal: false, retryAfter: -1, calls: 4, user: userUnavailable,
			operator: "the model server failed on 4 calls in a row in this attempt (last: 502 Bad Gateway: upstream): " + checkServer,
		},
		{
			name:     "502 page of a proxy",
			script:   []agenttest.Response{{Status: 502, ContentType: "text/html", Body: "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>"}},
			change:   func(c *agent.Config) { c.MaxRetries = -1 },
			kind:     agent.ErrModelUnavailable,
			terminal: false, retryAfter: -1, calls: 1, user: userUnavailable,
			operator: "the model server failed on 1 call in this attempt (last: 502 Bad Gateway: 502 Bad Gateway 502 Bad Gateway nginx): " + checkServer,
		},
		{
			name:     "stream cut short",
			mode:     "streamed",
			script:   []agenttest.Response{{Content: "Hello there", CutAfter: 1}, {Content: "Hello there", CutAfter: 1}},
			change:   func(c *agent.Config) { c.MaxRetries = 1 },
			kind:     agent.ErrModelUnavailable,
			terminal: false, retryAfter: -1, calls: 2, user: userUnavailable,
			operator: "the model server failed on 2 calls in a row in this attempt (last: the connection failed: unexpected EOF): " + checkServer,
		},
		{
			name:     "error event mid-stream",
			mode:     "streamed",
			script:   []agenttest.Response{{Content: "Hello there", ErrorAfter: 1}, {Content: "Hello there", ErrorAfter: 1}},
			change:   func(c *agent.Config) { c.MaxRetries = 1 },
			kind:     agent.ErrModelUnavailable,
			terminal: false, retryAfter: -1, calls: 2, user: userUnavailable,
			operator: "the model server failed on 2 calls in a row in this attempt (last: an error event in the stream: the server is overloaded): " + checkServer,
		},
		{
			name:     "malformed body, whole",
			mode:     "whole",
			script:   []agenttest.Response{notJSON, notJSON},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: "the model server's answers are not chat completions (2 calls in a row; last: the answer is not a chat completion: error parsing response json: invalid character '<' looking for beginning of value): " + checkProtocol,
		},
		{
			name:     "malformed body, streamed",
			mode:     "streamed",
			script:   []agenttest.Response{notJSON, notJSON},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: `the model server's answers are not chat completions (2 calls in a row; last: it answered a streaming request with "application/json" instead of server-sent events): ` + checkStream,
		},
		{
			name:     "malformed chunk in a stream",
			mode:     "streamed",
			script:   []agenttest.Response{{StreamBody: "data: {not json\n\n"}, {StreamBody: "data: {not json\n\n"}},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: "the model server's answers are not chat completions (2 calls in a row; last: the answer is not a chat completion: invalid character 'n' looking for beginning of object key string): " + checkStream,
		},
		{
			name:     "HTML where JSON belongs",
			mode:     "whole",
			script:   []agenttest.Response{{ContentType: "text/html", Body: "<html>login</html>"}, {ContentType: "text/html", Body: "<html>login</html>"}},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: `the model server's answers are not chat completions (2 calls in a row; last: it answered with "text/html" instead of JSON): ` + checkProtocol,
		},
		{
			name:     "no choices",
			mode:     "whole",
			script:   []agenttest.Response{{Body: `{"id":"x","object":"chat.completion","choices":[]}`}, {Body: `{"id":"x","object":"chat.completion","choices":[]}`}},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: "the model server's answers are not chat completions (2 calls in a row; last: the answer is not a chat completion: the response has no choices): " + checkProtocol,
		},
		{
			name:     "a stream that ends without a finish reason",
			mode:     "streamed",
			script:   []agenttest.Response{{Content: "Hi", FinishReason: "-"}, {Content: "Hi", FinishReason: "-"}},
			kind:     agent.ErrMalformedResponse,
			terminal: true, retryAfter: -1, calls: 2, user: userMalformed,
			operator: "the model server's answers are not chat completions (2 calls in a row; last: the answer is not a chat completion: the streamed response ended without a finish reason): " + checkStream,
		},
		{
			name:     "the call budget ends retries, saying what failed",
			script:   []agenttest.Response{upstream, upstream},
			change:   func(c *agent.Config) { c.MaxModelCalls = 2 },
			kind:     agent.ErrBudgetExceeded,
			terminal: true, retryAfter: -1, calls: 2, user: userModelCalls,
			operator: "the turn made all 2 model calls it may make (BATON_MAX_MODEL_CALLS, --max-model-calls); the last one failed: 502 Bad Gateway: upstream",
		},
	}
}

// TestEachFaultIsClassifiedByWhatARetryWouldChange runs every fault
// through the real client against the fake server, streamed and whole,
// and checks the classification, the calls made and both texts whole.
func TestEachFaultIsClassifiedByWhatARetryWouldChange(t *testing.T) {
	t.Parallel()
	for _, f := range faults() {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			both(t, func(t *testing.T, streaming bool) {
				if (f.mode == "streamed" && !streaming) || (f.mode == "whole" && streaming) {
					t.Skip("a fault of the other mode")
				}
				script := f.script
				if f.dated != nil {
					script = f.dated()
				}
				srv := agenttest.NewServer(t, script...)
				a := newAgent(t, srv, func(c *agent.Config) {
					c.DisableStreaming = !streaming
					if f.change != nil {
						f.change(c)
					}
				})
				_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
				require.ErrorIs(t, err, f.kind)
				require.Equal(t, f.terminal, agent.IsTerminal(err), "terminal")
				require.Equal(t, f.terminal, consumer.IsTerminal(err), "terminal as the turn runner sees it")
				require.Len(t, srv.Requests(), f.calls, "model calls")

				var ra consumer.RetryAfterError
				if f.retryAfter < 0 {
					require.False(t, errors.As(err, &ra), "%v must not ask the turn runner to wait", err)
				} else {
					require.True(t, errors.As(err, &ra), "%v must ask the turn runner to wait", err)
					switch f.name {
					case "503 without Retry-After asks for a backoff":
						// RateLimitDelay on the first attempt, less a jitter
						// of up to half.
						require.GreaterOrEqual(t, ra.RetryAfter(), f.retryAfter/2)
						require.LessOrEqual(t, ra.RetryAfter(), f.retryAfter)
					case "529 with Retry-After as an HTTP date":
						// An HTTP date has whole seconds.
						require.InDelta(t, f.retryAfter.Seconds(), ra.RetryAfter().Seconds(), 2)
					default:
						require.Equal(t, f.retryAfter, ra.RetryAfter())
					}
				}
				want := f.operator
				if f.operatorf != "" {
					want = fmt.Sprintf(f.operatorf, ra.RetryAfter())
				}
				require.Equal(t, want, err.Error())
				var u interface{ UserText() string }
				require.True(t, errors.As(err, &u))
				require.Equal(t, f.user, u.UserText())
				for _, text := range []string{err.Error(), u.UserText()} {
					require.NotContains(t, text, "sk-te", "no text may hold the API key")
					require.NotContains(t, text, srv.URL, "no text names the server's URL")
				}
				for _, s := range []string{"BATON_", "--", "http", "/v1", "sk-"} {
					require.NotContains(t, u.UserText(), s, "the user's text names no setting, flag, server or secret")
				}
			})
		})
	}
}

func TestAConnectionRefusedIsRetriedThenUnavailable(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewServer(t)
	host := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	a := newAgent(t, srv, func(c *agent.Config) { c.MaxRetries = 2 })
	_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.ErrorIs(t, err, agent.ErrModelUnavailable)
	require.False(t, agent.IsTerminal(err))
	require.Equal(t, "the model server failed on 3 calls in a row in this attempt (last: the connection failed: dial tcp "+host+": connect: connection refused): "+checkServer, err.Error())
	require.Equal(t, userUnavailable, userText(t, err))
}

func TestAMalformedAnswerIsRetriedOnceAndAGoodOneWins(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, agenttest.Response{Body: `<html>hello</html>`}, agenttest.Response{Content: "fine"})
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		reply, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		require.Equal(t, consumer.Reply{Content: "fine"}, reply)
		require.Len(t, srv.Requests(), 2)
	})
}

func TestARetryAfterOf45SecondsIsHandedToTheTurnRunnerAfterOneCall(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, status(429, errorBody("slow down", "requests", ""), "Retry-After", "45"))
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming })
		start := time.Now()
		_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
		var ra consumer.RetryAfterError
		require.True(t, errors.As(err, &ra), "%v", err)
		require.Equal(t, 45*time.Second, ra.RetryAfter())
		var rl *agent.RateLimitError
		require.True(t, errors.As(err, &rl))
		require.Equal(t, 429, rl.StatusCode)
		require.Len(t, srv.Requests(), 1, "the wait is the turn runner's, not a retry inside the attempt")
		require.Less(t, time.Since(start), 10*time.Second, "the attempt must not wait out the Retry-After")
	})
}

func TestARateLimitWithoutRetryAfterBacksOffMoreOnLaterAttempts(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 3: 8 * time.Second, 6: 30 * time.Second} {
		srv := agenttest.NewServer(t, status(429, errorBody("slow down", "requests", "")))
		a := newAgent(t, srv, func(c *agent.Config) { c.MaxRetryDelay = 30 * time.Second })
		turn := turnOf("hi")
		turn.Attempt = attempt
		_, err := run(context.Background(), a, turn, newExecutor(agent.NewRegistry()))
		var ra consumer.RetryAfterError
		require.True(t, errors.As(err, &ra), "%v", err)
		require.GreaterOrEqual(t, ra.RetryAfter(), want/2, "attempt %d", attempt)
		require.LessOrEqual(t, ra.RetryAfter(), want, "attempt %d", attempt)
		require.Equal(t, fmt.Sprintf("the model server is busy (429 Too Many Requests: slow down, on 1 call in this attempt) and sent no Retry-After: the turn is to be tried again in %s (backoff for attempt %d); %s", ra.RetryAfter(), attempt, checkLimits), err.Error())
	}
}

// userText is what the user reads of err.
func userText(t *testing.T, err error) string {
	t.Helper()
	var u interface{ UserText() string }
	require.True(t, errors.As(err, &u), "%v has no text for the user", err)
	return u.UserText()
}

// TestEachKindOfFailureHasItsOwnMetricReason: the worker counts failed
// attempts by reason; each kind names a different one.
func TestEachKindOfFailureHasItsOwnMetricReason(t *testing.T) {
	kinds := []error{agent.ErrModelRefused, agent.ErrModelAuth, agent.ErrModelNotFound, agent.ErrUnsupported,
		agent.ErrContextTooLong, agent.ErrContentFiltered, agent.ErrEmptyReply, agent.ErrTruncated,
		agent.ErrMalformedResponse, agent.ErrRateLimited, agent.ErrModelUnavailable, agent.ErrModelTimeout,
		agent.ErrBudgetExceeded, agent.ErrContextBudget}
	seen := map[string]error{}
	for _, k := range kinds {
		var r consumer.FailureReasoner = &agent.ModelError{Kind: k, Message: "m"}
		reason := r.FailureReason()
		require.Regexp(t, `^[a-z_]+$`, reason)
		require.NotEqual(t, "model_other", reason, "%v has no reason of its own", k)
		require.NotContains(t, seen, reason, "%v and %v share a reason", k, seen[reason])
		seen[reason] = k
	}
	var rl consumer.FailureReasoner = &agent.RateLimitError{ModelError: &agent.ModelError{Kind: agent.ErrRateLimited}}
	require.Equal(t, "rate_limited", rl.FailureReason())
}
