package agent

import (
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors of a turn, for errors.Is. A *ModelError wraps one of the
// first four.
var (
	// ErrModelRefused: the model server refused the request (400, 401, 403,
	// 404 and other 4xx but 408 and 429). Retrying cannot help; the turn
	// should fail with the error's message, which says what to fix.
	ErrModelRefused = errors.New("model server refused the request")
	// ErrModelUnavailable: the model server kept answering 429 or 5xx, or
	// could not be reached, after the retries of the attempt. Another
	// attempt may succeed.
	ErrModelUnavailable = errors.New("model server unavailable")
	// ErrModelTimeout: a model call took longer than RequestTimeout. It
	// ends the attempt; another attempt may succeed.
	ErrModelTimeout = errors.New("model call timed out")
	// ErrMalformedResponse: the model server answered with something that
	// is not a chat completion.
	ErrMalformedResponse = errors.New("malformed model response")
	// ErrBudgetExceeded: the turn used all the model calls or tool rounds
	// it may use.
	ErrBudgetExceeded = errors.New("turn budget exceeded")
)

// ModelError is a failed turn, with a message meant for the person who
// reads the conversation or runs Baton: it says what went wrong and what
// to fix, and never holds the API key.
type ModelError struct {
	// Kind is one of the sentinel errors above.
	Kind error
	// StatusCode is the HTTP status of the model server's answer, 0 if
	// there was none.
	StatusCode int
	// Message is the visible explanation.
	Message string
	// Cause is the underlying error, for logs.
	Cause error
}

func (e *ModelError) Error() string { return e.Message }

// Unwrap lets errors.Is match Kind and the cause.
func (e *ModelError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// Terminal reports whether another attempt at the turn would fail the same
// way: a refused request or an exhausted budget. The turn runner should
// show the error at once instead of retrying.
func (e *ModelError) Terminal() bool {
	return errors.Is(e.Kind, ErrModelRefused) || errors.Is(e.Kind, ErrBudgetExceeded)
}

// IsTerminal reports whether err ends a turn for good (see
// ModelError.Terminal).
func IsTerminal(err error) bool {
	var me *ModelError
	return errors.As(err, &me) && me.Terminal()
}

// refusal builds the error of a 4xx answer: each says what to check.
// detail is the server's own message, when it gave one.
func refusal(status int, model, detail string, cause error) *ModelError {
	text := fmt.Sprintf("%d %s", status, http.StatusText(status))
	if detail != "" {
		text += ": " + truncate(detail, 300)
	}
	var msg string
	switch status {
	case http.StatusUnauthorized:
		// The server's detail may echo part of the key: leave it out.
		msg = "the model server refused the API key (401 Unauthorized): check BATON_MODEL_API_KEY (--model-api-key)"
	case http.StatusForbidden:
		msg = fmt.Sprintf("the model server denied access to model %q (%s): check that the key in BATON_MODEL_API_KEY (--model-api-key) may use it", model, text)
	case http.StatusNotFound:
		msg = fmt.Sprintf("the model server has no model %q or no chat completions endpoint (%s): check BATON_MODEL (--model), and BATON_MODEL_BASE_URL (--model-base-url), which usually ends in /v1", model, text)
	case http.StatusBadRequest:
		msg = fmt.Sprintf("the model server rejected the request (%s): check that model %q (BATON_MODEL, --model) supports chat with tools", model, text)
	default:
		msg = fmt.Sprintf("the model server refused the request (%s): check BATON_MODEL_BASE_URL (--model-base-url) and BATON_MODEL (--model)", text)
	}
	return &ModelError{Kind: ErrModelRefused, StatusCode: status, Message: msg, Cause: cause}
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
