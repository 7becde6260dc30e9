// Package api is Baton's HTTP API: conversations and messages for clients,
// health and metrics for operators. It writes user messages through the
// producer (message and outbox row in one transaction) and never creates
// queue state from client input: a client gives a message ID and content,
// nothing else.
package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// DefaultMaxContentBytes is the default limit on a message's content.
const DefaultMaxContentBytes = 64 << 10

// Config configures the API server.
type Config struct {
	// Pool is the PostgreSQL pool. Required.
	Pool *pgxpool.Pool
	// MaxContentBytes limits the content of one message, in bytes; larger
	// messages get 413. Defaults to 64 KiB.
	MaxContentBytes int
	// Log receives request errors. Defaults to a no-op logger.
	Log zerolog.Logger
	// Registerer receives the API's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
	// JetStream, when set, serves live conversation events
	// (GET /v1/conversations/{cid}/events) from the events stream, and
	// the API publishes the changes it commits there. Without it the
	// events endpoint answers 503.
	JetStream jetstream.JetStream
	// NATS, when set, carries partial reply text to live clients.
	NATS *natsclient.Conn
	// Events is the conversation events stream. Defaults to BATON_EVENTS
	// under baton.events.
	Events batonnats.EventsConfig
	// Gatherer serves GET /metrics. Defaults to prometheus.DefaultGatherer
	// when Registerer is the default registerer, else to the private
	// registry.
	Gatherer prometheus.Gatherer
}

// WithDefaults returns a copy of c with every zero field set.
func (c Config) WithDefaults() Config {
	c.Events = c.Events.WithDefaults()
	if c.MaxContentBytes == 0 {
		c.MaxContentBytes = DefaultMaxContentBytes
	}
	if c.Registerer == nil {
		reg := prometheus.NewRegistry()
		c.Registerer = reg
		if c.Gatherer == nil {
			c.Gatherer = reg
		}
	}
	if c.Gatherer == nil {
		c.Gatherer = prometheus.DefaultGatherer
	}
	return c
}

func (c Config) validate() error {
	if c.Pool == nil {
		return errors.New("api: Config.Pool is nil")
	}
	if c.MaxContentBytes < 1 {
		return errors.New("api: MaxContentBytes must be at least 1 (--max-content-bytes / BATON_MAX_CONTENT_BYTES)")
	}
	return nil
}

// Server serves the API.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     zerolog.Logger
	metrics *metrics
	mux     *http.ServeMux

	eventsCfg batonnats.EventsConfig
	events    *batonnats.EventPublisher
	closing   chan struct{}
	closeOnce sync.Once
}

// New builds a server.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pool: cfg.Pool, log: cfg.Log, metrics: m, mux: http.NewServeMux(),
		eventsCfg: cfg.Events, closing: make(chan struct{})}
	if cfg.JetStream != nil {
		s.events = batonnats.NewEventPublisher(cfg.JetStream, cfg.Events)
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	s.handle("GET /{$}", s.index)
	s.handle("GET /healthz", s.healthz)
	s.handle("GET /readyz", s.readyz)
	s.handle("GET /app.js", s.asset("text/javascript; charset=utf-8", appJS))
	s.handle("GET /app.css", s.asset("text/css; charset=utf-8", appCSS))
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{}))

	s.handle("POST /v1/conversations", s.auth(s.createConversation))
	s.handle("GET /v1/conversations", s.auth(s.listConversations))
	s.handle("GET /v1/conversations/{cid}", s.auth(s.getConversation))
	s.handle("DELETE /v1/conversations/{cid}", s.auth(s.deleteConversation))
	s.handle("POST /v1/conversations/{cid}/messages", s.auth(s.postMessage))
	s.handle("GET /v1/conversations/{cid}/messages", s.auth(s.listMessages))
	s.handle("POST /v1/conversations/{cid}/read", s.auth(s.markRead))
	s.handle("POST /v1/conversations/{cid}/retry", s.auth(s.retryFailed))
	s.handle("GET /v1/conversations/{cid}/events", s.authStream(s.conversationEvents))
	// Anything else under /v1 is a JSON 404, not the mux's plain text.
	s.handle("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
}

// handle registers h under pattern with request metrics.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.mux.Handle(pattern, s.instrument(pattern, h))
}

// Close ends the open event streams, so that a graceful shutdown does not
// wait for clients that never hang up. Register it with
// http.Server.RegisterOnShutdown.
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closing) }) }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "database_unreachable", "the database is not reachable: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
