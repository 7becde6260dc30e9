package agent

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Sentinel errors of a turn, for errors.Is. A *ModelError wraps one of
// them as its Kind; a *RateLimitError wraps a *ModelError of kind
// ErrRateLimited.
//
// Each fault is classified by what another attempt would change. Terminal
// ones (Terminal() is true) fail the turn at once: a refusal, a missing
// model, an unsupported feature, a content filter, an empty or cut-off
// answer with nothing in it, answers that are not chat completions, an
// exhausted budget. The others leave the turn to another attempt: a rate
// limit or an overload (after the wait it asks for, RetryAfter), a server
// that failed or could not be reached through the retries inside the
// attempt, a call that stopped making progress.
var (
	// ErrModelRefused: the model server refused the request (a 4xx other
	// than 408 and 429). It is also matched by the more precise refusals
	// below.
	ErrModelRefused = errors.New("model server refused the request")
	// ErrModelAuth: the model server refused the API key (401) or the
	// key's access to the model (403).
	ErrModelAuth = errors.New("model server refused the credentials")
	// ErrModelNotFound: the model server knows no such model, or has no
	// chat completions endpoint at the base URL (404).
	ErrModelNotFound = errors.New("model not found")
	// ErrUnsupported: the model or the server does not support what the
	// request uses (tools, streaming).
	ErrUnsupported = errors.New("model does not support the request")
	// ErrContextTooLong: the model server says the request exceeds the
	// model's context window.
	ErrContextTooLong = errors.New("request exceeds the model's context")
	// ErrContentFiltered: the model server's content filter stopped the
	// request or the answer.
	ErrContentFiltered = errors.New("content filtered")
	// ErrEmptyReply: the model answered with no text and no tool call.
	ErrEmptyReply = errors.New("empty reply")
	// ErrTruncated: the model reached its output limit before writing any
	// text. (An answer cut off after some text is a reply with
	// consumer.Reply.Truncated set, not an error.)
	ErrTruncated = errors.New("reply cut off before any text")
	// ErrMalformedResponse: the model server answered twice in a row with
	// something that is not a chat completion (or, for a streaming
	// request, not a stream of chunks).
	ErrMalformedResponse = errors.New("malformed model response")
	// ErrRateLimited: the model server is rate limiting or overloaded
	// (429, 503, 529). Returned as a *RateLimitError, whose RetryAfter
	// says when to try again.
	ErrRateLimited = errors.New("model server rate limited or overloaded")
	// ErrModelUnavailable: the model server kept failing (5xx) or could not
	// be reached through the retries of the attempt. Another attempt may
	// succeed.
	ErrModelUnavailable = errors.New("model server unavailable")
	// ErrModelTimeout: a model call made no progress for too long (no first
	// byte within FirstByteTimeout, or a pause longer than IdleTimeout), or
	// ran past RequestTimeout. It ends the attempt; another may succeed.
	ErrModelTimeout = errors.New("model call timed out")
	// ErrBudgetExceeded: the turn used all the model calls or tool rounds
	// it may use.
	ErrBudgetExceeded = errors.New("turn budget exceeded")
	// ErrContextBudget: the turn does not fit ContextTokens even with its
	// tool results left out and its messages cut.
	ErrContextBudget = errors.New("turn does not fit the context budget")
	// ErrUnsupportedFile: a message of the turn has a file of a media type
	// the model server takes not (Config.ModelMedia), and not text.
	ErrUnsupportedFile = errors.New("the model server takes no file of this media type")
)

// Sentinel errors of an external agent (External), classified the same
// way: what another attempt cannot change is terminal; a busy agent asks
// for a wait (a *RateLimitError of kind ErrRateLimited); an agent that
// failed, timed out or could not be reached through the retries of the
// attempt leaves the turn to another attempt. An empty answer is
// ErrEmptyReply, as for the model.
var (
	// ErrAgentRefused: the agent refused the step (a 4xx other than 408,
	// 425 and 429, or a redirect). It is also matched by ErrAgentAuth and
	// ErrAgentNotFound.
	ErrAgentRefused = errors.New("agent refused the step")
	// ErrAgentAuth: the agent refused Baton's credentials (401) or denied
	// it access (403).
	ErrAgentAuth = errors.New("agent refused the credentials")
	// ErrAgentNotFound: there is no agent at the URL (404).
	ErrAgentNotFound = errors.New("agent not found")
	// ErrAgentMalformed: the agent's answer is not a stream of its
	// protocol's events (not server-sent events, a frame that is not
	// JSON, an event without the fields it needs).
	ErrAgentMalformed = errors.New("malformed agent answer")
	// ErrAgentUnavailable: the agent kept failing (5xx), could not be
	// reached, or its streams ended before the step did, through the
	// retries of the attempt. Another attempt may succeed.
	ErrAgentUnavailable = errors.New("agent unavailable")
	// ErrAgentTimeout: the agent's answers kept making no progress (no
	// first byte, or a pause too long) or ran past the cap of a step
	// request, through the retries of the attempt.
	ErrAgentTimeout = errors.New("agent timed out")
	// ErrAgentFailed: the agent reported that its run failed (AG-UI
	// RUN_ERROR, an AI SDK error or abort chunk) through the retries of
	// the attempt.
	ErrAgentFailed = errors.New("agent run failed")
	// ErrStepTooLarge: the answer to one step was larger than
	// ExternalConfig.MaxStepBytes.
	ErrStepTooLarge = errors.New("agent step answer too large")
	// ErrTooManyToolCalls: one step asked for more tool calls than
	// ExternalConfig.MaxToolCalls.
	ErrTooManyToolCalls = errors.New("agent step asked for too many tool calls")
	// ErrAgentTaskFailed: an A2A agent ended the step's task as failed or
	// canceled. Another attempt would find the same task (see A2A), so
	// it is terminal; a user's explicit retry sends a new message.
	ErrAgentTaskFailed = errors.New("agent task failed")
)

// refusals are the precise refusals, each with the broader kind that
// errors.Is matches too.
var refusals = []struct{ kind, broader error }{
	{ErrModelAuth, ErrModelRefused},
	{ErrModelNotFound, ErrModelRefused},
	{ErrUnsupported, ErrModelRefused},
	{ErrContextTooLong, ErrModelRefused},
	{ErrAgentAuth, ErrAgentRefused},
	{ErrAgentNotFound, ErrAgentRefused},
}

// ModelError is a failed turn, with two texts: Message for the person who
// runs Baton (what happened, and which setting to check), User for the
// person who reads the conversation (short, naming no setting, flag,
// server or secret). Neither ever holds the API key, an external agent's
// URL or a header value sent to it. An external agent's failures are
// ModelErrors too, of the ErrAgent kinds.
type ModelError struct {
	// Kind is one of the sentinel errors above.
	Kind error
	// StatusCode is the HTTP status of the model server's answer, 0 if
	// there was none.
	StatusCode int
	// Message is the operator's explanation (Error).
	Message string
	// User is the user's explanation (UserText).
	User string
	// Cause is the underlying error, for logs.
	Cause error
}

func (e *ModelError) Error() string { return e.Message }

// reasons are the metric labels of the kinds (consumer.FailureReasoner).
var reasons = []struct {
	kind   error
	reason string
}{
	{ErrUnsupported, "unsupported"},
	{ErrContextTooLong, "context_too_long"},
	{ErrContentFiltered, "content_filtered"},
	{ErrModelRefused, "model_refused"},
	{ErrModelAuth, "model_auth"},
	{ErrModelNotFound, "model_not_found"},
	{ErrEmptyReply, "empty_reply"},
	{ErrTruncated, "truncated"},
	{ErrMalformedResponse, "malformed_response"},
	{ErrRateLimited, "rate_limited"},
	{ErrModelUnavailable, "model_unavailable"},
	{ErrModelTimeout, "model_timeout"},
	{ErrBudgetExceeded, "budget_exceeded"},
	{ErrContextBudget, "context_budget"},
	{ErrUnsupportedFile, "unsupported_file"},
	{ErrAgentRefused, "agent_refused"},
	{ErrAgentAuth, "agent_auth"},
	{ErrAgentNotFound, "agent_not_found"},
	{ErrAgentMalformed, "agent_malformed"},
	{ErrAgentUnavailable, "agent_unavailable"},
	{ErrAgentTimeout, "agent_timeout"},
	{ErrAgentFailed, "agent_failed"},
	{ErrStepTooLarge, "agent_step_too_large"},
	{ErrTooManyToolCalls, "agent_too_many_tool_calls"},
	{ErrAgentTaskFailed, "agent_task_failed"},
}

// FailureReason names the kind of failure for the worker's metric
// baton_turn_failures_total{reason}.
func (e *ModelError) FailureReason() string {
	for _, r := range reasons {
		if e.Kind == r.kind {
			return r.reason
		}
	}
	return "model_other"
}

// UserText is what the user reads about the failed turn (see
// consumer.TerminalError).
func (e *ModelError) UserText() string { return e.User }

// Unwrap lets errors.Is match Kind (and ErrModelRefused or
// ErrAgentRefused for the precise refusals) and the cause.
func (e *ModelError) Unwrap() []error {
	out := []error{e.Kind}
	for _, r := range refusals {
		if e.Kind == r.kind {
			out = append(out, r.broader)
		}
	}
	if e.Cause != nil {
		out = append(out, e.Cause)
	}
	return out
}

// Terminal reports whether another attempt at the turn would fail the same
// way. The turn runner shows the error at once instead of retrying.
func (e *ModelError) Terminal() bool {
	switch e.Kind {
	case ErrRateLimited, ErrModelUnavailable, ErrModelTimeout, ErrAgentUnavailable, ErrAgentTimeout, ErrAgentFailed:
		return false
	}
	return true
}

// IsTerminal reports whether err ends a turn for good (see
// ModelError.Terminal).
func IsTerminal(err error) bool {
	var t interface{ Terminal() bool }
	return errors.As(err, &t) && t.Terminal()
}

// MaxRetryAfter caps the wait a RateLimitError asks for, whatever the
// server's Retry-After says.
const MaxRetryAfter = time.Hour

// RateLimitError is a rate limit or an overload (429, 503, 529) that asks
// for the next attempt no sooner than After: the server's Retry-After
// (seconds or an HTTP date, at most MaxRetryAfter), or an exponential
// backoff when it sent none. It implements consumer.RetryAfterError, so
// the turn runner releases the turn with that not-before time instead of
// waiting inside its lease. It is not terminal.
type RateLimitError struct {
	*ModelError
	// After is how long to wait before the next attempt.
	After time.Duration
}

// RetryAfter is the wait before the next attempt.
func (e *RateLimitError) RetryAfter() time.Duration { return e.After }

// Unwrap returns the *ModelError, so errors.As finds it and errors.Is
// matches ErrRateLimited.
func (e *RateLimitError) Unwrap() error { return e.ModelError }

// The texts users read. They name no setting, flag, server or secret: the
// operator's texts do.
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

// The texts users read about an external agent's failures.
const (
	userAgentSetup       = "The assistant could not answer because its agent service is not set up correctly. An administrator needs to fix it."
	userAgentAuth        = "The assistant could not answer because it is not allowed to use its agent service. An administrator needs to fix it."
	userAgentMalformed   = "The assistant could not answer because it could not read its agent service's answers. An administrator needs to fix it."
	userAgentBusy        = "The assistant's agent service is busy. Press Retry or send your message again in a minute."
	userAgentUnavailable = "The assistant's agent service is not responding. Press Retry or send your message again later."
	userAgentTimeout     = "The assistant's agent service stopped responding. Press Retry or send your message again."
	userAgentFailed      = "The assistant's agent service failed while answering. Press Retry or send your message again."
	userAgentEmpty       = "The assistant gave an empty answer. Try rephrasing your message."
	userAgentTooLarge    = "The assistant's answer was longer than it may be, so it was stopped. Try asking for less at a time."
	userAgentTooManyCall = "The assistant asked for more tool calls at once than it may make, so it was stopped. Try asking for less at a time."
	userAgentRejected    = "The assistant's agent service declined to answer this message."
)

// keyLike matches what looks like an API key in a server's message, which
// some servers echo back in part.
var keyLike = regexp.MustCompile(`\b(sk|pk|rk|key)[-_][A-Za-z0-9*._-]{4,}`)

// detail is a server's message made safe to show an operator: shortened,
// on one line, with the API key and anything like a key taken out.
func detail(s, apiKey string) string {
	if apiKey != "" {
		s = strings.ReplaceAll(s, apiKey, "[key]")
	}
	s = keyLike.ReplaceAllString(s, "[key]")
	s = strings.Join(strings.Fields(s), " ")
	return truncate(s, 300)
}

// statusText is "400 Bad Request", or "400 Bad Request: detail".
func statusText(status int, text, d string) string {
	s := fmt.Sprintf("%d %s", status, text)
	if d != "" {
		s += ": " + d
	}
	return s
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
