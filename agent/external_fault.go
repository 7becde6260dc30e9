package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// stepFault is a failed step request, classified by what another request
// would change.
type stepFault struct {
	// what is the failed request in a few words, for the operator.
	what string
	// status is the HTTP status, 0 if there was none.
	status int
	// terminal, when set, is the step's error at once: another request
	// would fail the same way.
	terminal error
	// rateLimit marks a 429, 503 or 529: waited inside the attempt only
	// for a short Retry-After.
	rateLimit bool
	// kind is the failure's kind when the retries run out:
	// ErrAgentUnavailable, ErrAgentTimeout or ErrAgentFailed.
	kind error
	// retryAfter is what the agent asked to wait, if hasRetryAfter.
	retryAfter    time.Duration
	hasRetryAfter bool
	cause         error
}

func (f *stepFault) Error() string { return f.what }

// classify classifies a request that failed before or while its answer
// streamed. callCtx is the request's context, whose cause says whether
// the watch or the cap cut it short.
func (s *externalStep) classify(callCtx context.Context, err error) *stepFault {
	var te *timeoutError
	var me *malformedError
	var tl *stepTooLargeError
	var tm *tooManyCallsError
	var rf *runFailure
	var tr *transportError
	switch {
	case errors.As(context.Cause(callCtx), &te):
		return &stepFault{kind: ErrAgentTimeout, what: s.timeoutText(te), cause: err}
	case errors.As(err, &me):
		return s.malformed(me)
	case errors.As(err, &tl):
		return s.terminal(ErrStepTooLarge, 0, userAgentTooLarge, err,
			"the agent's answer to the step was longer than %d bytes, the most Baton reads of one step (BATON_AGENT_MAX_STEP_BYTES, --agent-max-step-bytes; every event counts, those Baton skips too): raise it, or make the agent send less (large RAW or STATE events)", tl.max)
	case errors.As(err, &tm):
		return s.terminal(ErrTooManyToolCalls, 0, userAgentTooManyCall, err,
			"the agent asked for more than %d tool calls in one step, the most a step may ask for (BATON_AGENT_MAX_TOOL_CALLS, --agent-max-tool-calls): raise it if the agent needs more", tm.max)
	case errors.As(err, &rf):
		return &stepFault{kind: ErrAgentFailed, what: s.redact(rf.what), cause: err}
	case errors.Is(err, errStreamEnded):
		return &stepFault{kind: ErrAgentUnavailable, what: "the stream ended before the step did (no " + s.end + ")", cause: err}
	case errors.As(err, &tr):
		what := "the connection failed: " + s.redact(tr.Error())
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			what += " (the agent's certificate is not trusted: give the CA that signed it in BATON_AGENT_TLS_CA, --agent-tls-ca)"
		}
		return &stepFault{kind: ErrAgentUnavailable, what: what, cause: err}
	}
	return &stepFault{kind: ErrAgentUnavailable, what: s.redact(err.Error()), cause: err}
}

// classifyStatus classifies an answer with a status other than 2xx.
func (s *externalStep) classifyStatus(status int, header http.Header, body []byte) *stepFault {
	info := parseErrorBody(body)
	what := statusText(status, http.StatusText(status), s.redact(info.message))
	f := &stepFault{status: status, what: what, kind: ErrAgentUnavailable}
	f.retryAfter, f.hasRetryAfter = parseRetryAfter(header, time.Now())
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || status == 529:
		f.rateLimit = true
		return f
	case status == http.StatusRequestTimeout || status == http.StatusTooEarly || status >= 500 && status != http.StatusNotImplemented:
		return f
	case status == http.StatusUnauthorized:
		// The agent's message may quote the token: left out.
		return s.terminal(ErrAgentAuth, status, userAgentAuth, nil,
			"the agent refused Baton's credentials (401 Unauthorized): check the token it expects: the headers Baton sends it (--agent-header), or the signing key and the audience (%q) of the tokens Baton signs for it", s.cfg.Audience)
	case status == http.StatusForbidden:
		return s.terminal(ErrAgentAuth, status, userAgentAuth, nil,
			"the agent denied Baton access (%s): check that the token Baton sends (--agent-header, or the signed token, whose audience is %q) gives access to this agent", what, s.cfg.Audience)
	case status == http.StatusNotFound:
		return s.terminal(ErrAgentNotFound, status, userAgentSetup, nil,
			"there is no agent at the agent URL (%s): check BATON_AGENT_URL (--agent-url): it is the whole URL of the agent's route, path included", what)
	case status >= 300 && status < 400:
		return s.terminal(ErrAgentRefused, status, userAgentSetup, nil,
			"the agent answered with a redirect (%d %s), which Baton does not follow: give the URL it redirects to in BATON_AGENT_URL (--agent-url)", status, http.StatusText(status))
	default:
		return s.terminal(ErrAgentRefused, status, userAgentSetup, nil,
			"the agent rejected the step (%s): check that it speaks %s (--agent %s) at BATON_AGENT_URL (--agent-url), and its log for why", what, s.cfg.Protocol, s.cfg.Protocol)
	}
}

func (s *externalStep) terminal(kind error, status int, user string, cause error, format string, args ...any) *stepFault {
	msg := fmt.Sprintf(format, args...)
	return &stepFault{status: status, what: msg, cause: cause,
		terminal: &ModelError{Kind: kind, StatusCode: status, Message: msg, User: user, Cause: cause}}
}

func (s *externalStep) malformed(me *malformedError) *stepFault {
	return s.terminal(ErrAgentMalformed, 0, userAgentMalformed, me,
		"the agent's answer is not a %s stream (%s): check that BATON_AGENT_URL (--agent-url) is the agent's streaming endpoint and that it speaks %s (--agent %s)",
		s.cfg.Protocol, s.redact(me.what), s.cfg.Protocol, s.cfg.Protocol)
}

func (s *externalStep) timeoutText(te *timeoutError) string {
	switch te.what {
	case "first byte":
		return fmt.Sprintf("the agent sent nothing for %s after the step request (BATON_AGENT_FIRST_BYTE_TIMEOUT, --agent-first-byte-timeout)", te.after)
	case "idle":
		return fmt.Sprintf("the agent's answer stalled: nothing arrived for %s, %s into the request (BATON_AGENT_IDLE_TIMEOUT, --agent-idle-timeout)", te.after, te.streamed.Round(time.Millisecond))
	}
	return fmt.Sprintf("the step request was still running after %s, the longest one may take (BATON_AGENT_TIMEOUT, --agent-timeout)", te.after)
}

// requestsText is "1 request" or "n requests in a row".
func requestsText(n int) string {
	if n == 1 {
		return "1 request"
	}
	return fmt.Sprintf("%d requests in a row", n)
}

// exhausted is the error of a step whose retries ran out.
func (s *externalStep) exhausted(f *stepFault, n int) *ModelError {
	e := &ModelError{Kind: f.kind, StatusCode: f.status, Cause: f.cause}
	switch f.kind {
	case ErrAgentTimeout:
		e.User = userAgentTimeout
		e.Message = fmt.Sprintf("the agent made no progress on %s of the step in this attempt (last: %s): check its load at BATON_AGENT_URL (--agent-url), or raise the timeout for an agent that is slow to start or pauses long", requestsText(n), f.what)
	case ErrAgentFailed:
		e.User = userAgentFailed
		e.Message = fmt.Sprintf("the agent reported that its run failed on %s of the step in this attempt (last: %s): check the agent's log", requestsText(n), f.what)
	default:
		e.User = userAgentUnavailable
		e.Message = fmt.Sprintf("the agent failed on %s of the step in this attempt (last: %s): check that it is up and not overloaded at BATON_AGENT_URL (--agent-url)", requestsText(n), f.what)
	}
	return e
}

// rateLimited is the error of a busy agent: the turn waits with its
// lease released.
func (s *externalStep) rateLimited(f *stepFault, n int) *RateLimitError {
	var wait time.Duration
	var asked string
	switch {
	case f.hasRetryAfter && f.retryAfter > MaxRetryAfter:
		wait = MaxRetryAfter
		asked = fmt.Sprintf("asked to wait %s, more than the %s a turn waits: the turn is to be tried again in %s", f.retryAfter, MaxRetryAfter, wait)
	case f.hasRetryAfter:
		wait = f.retryAfter.Round(time.Millisecond)
		asked = fmt.Sprintf("asked to wait %s: the turn is to be tried again after that", wait)
	default:
		attempt := max(s.req.Turn.Attempt, 1)
		wait = backoff(attempt-1, s.cfg.RateLimitDelay, s.cfg.MaxRetryDelay).Round(time.Millisecond)
		asked = fmt.Sprintf("sent no Retry-After: the turn is to be tried again in %s (backoff for attempt %d)", wait, attempt)
	}
	return &RateLimitError{After: wait, ModelError: &ModelError{
		Kind: ErrRateLimited, StatusCode: f.status, User: userAgentBusy, Cause: f.cause,
		Message: fmt.Sprintf("the agent is busy (%s, on %s of the step in this attempt) and %s; if this persists, check the agent's capacity at BATON_AGENT_URL (--agent-url)", f.what, requestsText(n), asked),
	}}
}
