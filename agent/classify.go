package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/openai/openai-go/v3/packages/ssestream"
)

// fault is what a failed model call calls for.
type fault int

const (
	// faultTerminal: another call would fail the same way; the turn fails.
	faultTerminal fault = iota
	// faultRateLimit: 429, 503, 529. Waited inside the attempt only for a
	// Retry-After of at most MaxInlineRetryAfter; otherwise the attempt
	// ends with a *RateLimitError at once.
	faultRateLimit
	// faultUnavailable: another 5xx, a 408, a connection that failed or a
	// stream cut short. Retried inside the attempt with backoff.
	faultUnavailable
	// faultMalformed: not a chat completion. Retried once at once; a second
	// one in a row is terminal.
	faultMalformed
	// faultTimeout: no progress, or past the cap. Ends the attempt.
	faultTimeout
)

// failure is a failed model call, classified.
type failure struct {
	fault fault
	// what is the failed call in a few words, for the operator's text.
	what string
	// status is the HTTP status, 0 if there was none.
	status int
	// retryAfter is what the server asked to wait, if hasRetryAfter.
	retryAfter    time.Duration
	hasRetryAfter bool
	// err is the error to return for faultTerminal and faultTimeout.
	err   *ModelError
	cause error
}

func (f *failure) Error() string { return f.what }

// errorInfo is what an error answer says about itself.
type errorInfo struct {
	message, code, kind string
}

func (e errorInfo) has(words ...string) bool {
	s := strings.ToLower(e.message + " " + e.code + " " + e.kind)
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

var (
	contextWords     = []string{"context_length", "context length", "context window", "maximum context", "too many tokens", "prompt is too long", "input is too long"}
	filterWords      = []string{"content_filter", "content filter", "content_policy", "content policy", "content management policy"}
	unsupportedWords = []string{"not support", "unsupported", "not implemented"}
	htmlTag          = regexp.MustCompile(`<[^>]*>`)
)

// parseErrorBody reads the message, code and type of an error answer from
// the shapes servers use: {"error":{"message":..,"code":..,"type":..}},
// {"error":"text"}, {"message":..}, {"detail":..}, or plain text or HTML.
func parseErrorBody(b []byte) errorInfo {
	var doc map[string]any
	if json.Unmarshal(b, &doc) != nil {
		text := htmlTag.ReplaceAllString(string(b), " ")
		return errorInfo{message: strings.TrimSpace(text)}
	}
	obj := doc
	switch e := doc["error"].(type) {
	case map[string]any:
		obj = e
	case string:
		return errorInfo{message: e}
	}
	str := func(k string) string {
		switch v := obj[k].(type) {
		case string:
			return v
		case float64:
			return fmt.Sprint(v)
		case nil:
			return ""
		default:
			b, _ := json.Marshal(v)
			return string(b)
		}
	}
	info := errorInfo{message: str("message"), code: str("code"), kind: str("type")}
	if info.message == "" {
		info.message = str("detail")
	}
	return info
}

// classify turns a failed call into what the turn does about it. cause is
// the call's context cause, set when its watch or its cap cut it short.
func (t *stepCall) classify(err, cause error) *failure {
	var te *timeoutError
	var se *statusError
	var streamErr *ssestream.StreamError
	var pe *protocolError
	var tr *transportError
	switch {
	case errors.As(cause, &te):
		return &failure{fault: faultTimeout, what: te.Error(), err: t.timeoutError(te, err), cause: err}
	case errors.As(err, &se):
		return t.classifyStatus(se)
	case errors.As(err, &streamErr):
		var data struct {
			Error json.RawMessage `json:"error"`
		}
		_ = json.Unmarshal(streamErr.Event.Data, &data)
		info := parseErrorBody(data.Error)
		what := "an error event in the stream: " + detail(info.message, t.cfg.APIKey)
		switch {
		case info.has(filterWords...):
			return t.terminal(ErrContentFiltered, 0, userFiltered, err,
				"the model server's content filter stopped the answer (%s); another attempt would be filtered too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)", what)
		case info.has(contextWords...):
			return t.terminal(ErrContextTooLong, 0, userTooLong, err,
				"the request exceeds what model %q can take (%s): lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens, now %d) below its context window", t.cfg.Model, what, t.cfg.ContextTokens)
		}
		return &failure{fault: faultUnavailable, what: what, cause: err}
	case errors.As(err, &pe):
		return &failure{fault: faultMalformed, what: pe.msg, cause: err}
	case errors.As(err, &tr):
		return &failure{fault: faultUnavailable, what: "the connection failed: " + tr.Error(), cause: err}
	default:
		// A body that does not decode, no choices, or a stream that ended
		// cleanly (a connection cut short is a transportError) without a
		// finish reason.
		return &failure{fault: faultMalformed, what: "the answer is not a chat completion: " + truncate(err.Error(), 200), cause: err}
	}
}

// classifyStatus classifies an answer with an error status. The status
// decides, whatever the body; the body only refines a 4xx.
func (t *stepCall) classifyStatus(se *statusError) *failure {
	status := se.status
	info := parseErrorBody(se.body)
	d := detail(info.message, t.cfg.APIKey)
	what := statusText(status, http.StatusText(status), d)
	if status == 529 {
		what = statusText(status, "Overloaded", d)
	}
	f := &failure{status: status, what: what, cause: se}
	f.retryAfter, f.hasRetryAfter = parseRetryAfter(se.header, time.Now())
	model := t.cfg.Model
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || status == 529:
		f.fault = faultRateLimit
		return f
	case status == http.StatusNotImplemented:
		return t.terminal(ErrUnsupported, status, userSetup, se,
			"the model server does not implement this request (%s): check that BATON_MODEL_BASE_URL (--model-base-url) is the API root of a server with chat completions, and model %q (BATON_MODEL, --model) supports chat with tools", what, model)
	case status == http.StatusRequestTimeout || status >= 500:
		f.fault = faultUnavailable
		return f
	case status == http.StatusUnauthorized:
		// The server's message may quote part of the key: left out.
		return t.terminal(ErrModelAuth, status, userAuth, se,
			"the model server refused the API key (401 Unauthorized): check BATON_MODEL_API_KEY (--model-api-key)")
	case status == http.StatusForbidden:
		return t.terminal(ErrModelAuth, status, userAuth, se,
			"the model server denied access to model %q (%s): check that the key in BATON_MODEL_API_KEY (--model-api-key) may use it, and BATON_MODEL (--model)", model, what)
	case status == http.StatusNotFound:
		return t.terminal(ErrModelNotFound, status, userNotFound, se,
			"the model server has no model %q or no chat completions endpoint (%s): check BATON_MODEL (--model), and BATON_MODEL_BASE_URL (--model-base-url), which usually ends in /v1", model, what)
	case info.has(filterWords...):
		return t.terminal(ErrContentFiltered, status, userFiltered, se,
			"the model server's content filter refused the request (%s); another attempt would be refused too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)", what)
	case status == http.StatusRequestEntityTooLarge || info.has(contextWords...):
		return t.terminal(ErrContextTooLong, status, userTooLong, se,
			"the request exceeds what model %q can take (%s): lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens, now %d) below its context window", model, what, t.cfg.ContextTokens)
	case info.has(unsupportedWords...) && info.has("tool", "function"):
		return t.terminal(ErrUnsupported, status, userSetup, se,
			"model %q does not support tool calls (%s): choose a model that does (BATON_MODEL, --model)", model, what)
	case info.has(unsupportedWords...) && info.has("stream"):
		return t.terminal(ErrUnsupported, status, userSetup, se,
			"the model server does not support streaming for model %q (%s): set --model-streaming=false (BATON_MODEL_STREAMING=false)", model, what)
	case info.has(unsupportedWords...):
		return t.terminal(ErrUnsupported, status, userSetup, se,
			"model %q does not support the request (%s): check that it is a chat model that supports tools (BATON_MODEL, --model)", model, what)
	default:
		return t.terminal(ErrModelRefused, status, userSetup, se,
			"the model server rejected the request (%s): check that model %q (BATON_MODEL, --model) supports chat with tools, and BATON_MODEL_BASE_URL (--model-base-url)", what, model)
	}
}

func (t *stepCall) terminal(kind error, status int, user string, cause error, format string, args ...any) *failure {
	msg := fmt.Sprintf(format, args...)
	return &failure{fault: faultTerminal, status: status, what: msg, cause: cause,
		err: &ModelError{Kind: kind, StatusCode: status, Message: msg, User: user, Cause: cause}}
}

func (t *stepCall) timeoutError(te *timeoutError, cause error) *ModelError {
	var msg string
	switch te.what {
	case "first byte":
		msg = fmt.Sprintf("the model server sent nothing for %s after the request (BATON_MODEL_FIRST_BYTE_TIMEOUT, --model-first-byte-timeout): check its load at BATON_MODEL_BASE_URL, or raise the timeout for a model that is slow to start", te.after)
	case "idle":
		msg = fmt.Sprintf("the model's answer stalled: nothing arrived for %s, %s into the call (BATON_MODEL_IDLE_TIMEOUT, --model-idle-timeout): check the model server's load at BATON_MODEL_BASE_URL", te.after, te.streamed.Round(time.Millisecond))
	default:
		msg = fmt.Sprintf("the model call was still running after %s, the longest a call may take (BATON_MODEL_TIMEOUT, --model-timeout): raise it for very long answers", te.after)
	}
	return &ModelError{Kind: ErrModelTimeout, Message: msg, User: userTimeout, Cause: cause}
}
