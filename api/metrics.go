package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/internal/telemetry"
)

// Reasons of baton_api_live_deltas_dropped_total.
const (
	dropNotCurrentRun = "not_current_run"
	dropSlowClient    = "slow_client"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	messages *prometheus.CounterVec
	limited  *prometheus.CounterVec
	streams  prometheus.Gauge
	dropped  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_api_requests_total",
			Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "baton_api_request_duration_seconds",
			Help:    "HTTP request duration by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_api_messages_total",
			Help: "User messages posted, by outcome: stored (new turn), retry (already stored, no new turn), conflict, turn_running (refused: the conversation's double texting is reject and a turn runs).",
		}, []string{"outcome"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_api_limited_total",
			Help: "Requests refused by a limit: messages (per-user rate), streams_per_user, streams (per process).",
		}, []string{"limit"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_api_event_streams",
			Help: "Live event streams open.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_api_live_deltas_dropped_total",
			Help: "Live deltas not forwarded to a client, by reason: not_current_run (malformed, or not from the run that holds the conversation: a forgery, or a run that lost its lease), slow_client (the client's stream had 64 deltas waiting; previews only, never a reply or an event).",
		}, []string{"reason"}),
	}
	for _, r := range []string{dropNotCurrentRun, dropSlowClient} {
		m.dropped.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.messages, m.limited, m.streams, m.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// FlushError lets streaming handlers (server-sent events) flush through
// the recorder, with http.ResponseController.
func (r *statusRecorder) FlushError() error {
	return http.NewResponseController(r.ResponseWriter).Flush()
}

// Flush implements http.Flusher.
func (r *statusRecorder) Flush() { _ = r.FlushError() }

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// instrument counts and times each request of a route, and traces it: a
// caller's W3C traceparent is continued, otherwise a trace starts here
// (when tracing is on).
func (s *Server) instrument(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := telemetry.Tracer().Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", route)))
		defer span.End()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h(rec, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", rec.status))
		if rec.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.status))
		}
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
		s.metrics.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	}
}
