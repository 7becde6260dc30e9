package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batonhq/baton/consumer"
)

// The outcomes of one step request (baton_agent_step_seconds).
const (
	// outcomeOK: the answer was read to its end, and the step is what it
	// says.
	outcomeOK = "ok"
	// outcomeRetried: the request failed and the step sends it again.
	outcomeRetried = "retried"
	// outcomeFailed: the step failed on the request: it failed, or its
	// answer fails the step (empty, filtered, an interrupt). Only the
	// first is a failure to answer, for OnOutcome.
	outcomeFailed = "failed"
)

// classTransport is the class of a request that got no HTTP answer (a
// refused connection, a TLS failure, no answer in time).
const classTransport = "transport"

// agentReasons are the reasons of baton_agent_errors_total, each a series
// from the start so that a rate exists before the first failure.
var agentReasons = []string{
	"agent_refused", "agent_auth", "agent_not_found", "agent_malformed", "agent_unavailable", "agent_timeout",
	"agent_failed", "agent_step_too_large", "agent_too_many_tool_calls", "agent_interrupt", "rate_limited",
	"empty_reply", "content_filtered", "truncated",
}

// externalMetrics are an external agent's metrics. Their labels name the
// protocol, an outcome, a status class or a reason: never the URL or a
// header.
type externalMetrics struct {
	stepSeconds *prometheus.HistogramVec
	requests    *prometheus.CounterVec
	errors      *prometheus.CounterVec
	inFlight    *prometheus.GaugeVec
}

func newExternalMetrics(reg prometheus.Registerer, protocol string) (*externalMetrics, error) {
	m := &externalMetrics{
		stepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "baton_agent_step_seconds",
			Help:    "Time of one step request to an external agent, from sending it to the end of its stream, by protocol and outcome: ok (answered), retried (failed, sent again), failed (the step failed on it: the request failed, or its answer fails the step, as an empty one does). Requests Baton abandoned itself (a stopped turn, a lost lease) are left out.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"protocol", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_agent_requests_total",
			Help: "Step requests to an external agent, retries included, by protocol and class: the HTTP status class of the answer (2xx, 3xx, 4xx, 5xx), or transport when none came (refused, reset, TLS, no answer in time).",
		}, []string{"protocol", "class"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_agent_errors_total",
			Help: "Step requests to an external agent that failed, retried or not, by protocol and reason: agent_unavailable, agent_timeout, agent_failed, rate_limited, agent_refused, agent_auth, agent_not_found, agent_malformed, agent_step_too_large, agent_too_many_tool_calls; or an answer that fails its step: empty_reply, content_filtered, truncated, agent_interrupt.",
		}, []string{"protocol", "reason"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_agent_in_flight",
			Help: "Step requests to an external agent in flight (at most --agent-max-in-flight), by protocol.",
		}, []string{"protocol"}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	// A second agent on the same registry (of the same or another
	// protocol) adds its series to the metrics the first one registered.
	var err error
	if m.stepSeconds, err = register(reg, m.stepSeconds); err != nil {
		return nil, err
	}
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.errors, err = register(reg, m.errors); err != nil {
		return nil, err
	}
	if m.inFlight, err = register(reg, m.inFlight); err != nil {
		return nil, err
	}
	for _, o := range []string{outcomeOK, outcomeRetried, outcomeFailed} {
		m.stepSeconds.WithLabelValues(protocol, o)
	}
	for _, c := range []string{"2xx", "3xx", "4xx", "5xx", classTransport} {
		m.requests.WithLabelValues(protocol, c)
	}
	for _, r := range agentReasons {
		m.errors.WithLabelValues(protocol, r)
	}
	m.inFlight.WithLabelValues(protocol)
	return m, nil
}

// register registers c, or returns the collector of the same metric that
// reg already has.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// statusClass is the class of an HTTP status: "2xx" for 200 to 299.
func statusClass(status int) string {
	if status == 0 {
		return classTransport
	}
	return strconv.Itoa(status/100) + "xx"
}

// failed counts a request that failed with f, and tells OnOutcome why.
func (s *externalStep) failed(outcome string, f *stepFault) {
	reason := f.reason()
	s.metrics.errors.WithLabelValues(s.cfg.Protocol, reason).Inc()
	s.settle(outcome, reason+": "+s.brief(f))
}

// answered counts a request whose answer was read to its end: the step
// fails with err (an empty answer, an interrupt...) or succeeds. Either
// way, the agent answered.
func (s *externalStep) answered(err error) {
	var r consumer.FailureReasoner
	if err == nil || !errors.As(err, &r) {
		s.settle(outcomeOK, "")
		return
	}
	s.metrics.errors.WithLabelValues(s.cfg.Protocol, r.FailureReason()).Inc()
	s.settle(outcomeFailed, "")
}

// settle counts the last request by its outcome and its answer's status
// class, and tells OnOutcome: failure is why the agent did not answer,
// empty when it did.
func (s *externalStep) settle(outcome, failure string) {
	if s.sent.IsZero() {
		return
	}
	p := s.cfg.Protocol
	s.metrics.requests.WithLabelValues(p, statusClass(s.status)).Inc()
	s.metrics.stepSeconds.WithLabelValues(p, outcome).Observe(time.Since(s.sent).Seconds())
	if s.cfg.OnOutcome != nil {
		s.cfg.OnOutcome(EndpointOutcome{Endpoint: s.endpoint, At: time.Now(), Error: failure})
	}
}

// reason is the failure's label in baton_agent_errors_total, the same
// word baton_turn_failures_total uses for the step's error.
func (f *stepFault) reason() string {
	var r consumer.FailureReasoner
	switch {
	case f.terminal != nil && errors.As(f.terminal, &r):
		return r.FailureReason()
	case f.rateLimit:
		return "rate_limited"
	}
	return (&ModelError{Kind: f.kind}).FailureReason()
}

// brief is the failure in a few words, for `baton status`: the status
// alone for a refusal (whose text for the operator is long, and whose
// body may quote a token), what happened otherwise, without a secret.
func (s *externalStep) brief(f *stepFault) string {
	what := f.what
	if f.terminal != nil && f.status != 0 {
		what = fmt.Sprintf("%d %s", f.status, http.StatusText(f.status))
	}
	return truncate(s.redact(what), 200)
}
