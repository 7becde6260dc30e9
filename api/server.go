// Package api is Baton's HTTP API: conversations and messages for clients,
// health and metrics for operators. It writes user messages through the
// producer (message and outbox row in one transaction) and never creates
// queue state from client input: a client gives a message ID and content,
// nothing else.
package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/keyedlimit"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// DefaultMaxContentBytes is the default limit on a message's content.
const DefaultMaxContentBytes = 64 << 10

// Config configures the API server. It holds settings only: the database
// pool and JetStream come to New.
type Config struct {
	// MaxContentBytes limits the content of one message, in bytes; larger
	// messages get 413. At most schema.MaxContentBytes (1 MiB), the bound
	// of every producer. Defaults to 64 KiB.
	MaxContentBytes int
	// Logger receives request errors and the server's warnings. Defaults
	// to no logging.
	Logger *zerolog.Logger
	// Registerer receives the API's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
	// Events is the conversation events stream. Defaults to BATON_EVENTS
	// under baton.events.
	Events batonnats.EventsConfig
	// Quotas bound what one user can make the system do. Defaults to
	// Quotas' defaults.
	Quotas Quotas
	// StreamRecheck is how often an open event stream checks again that
	// its conversation still exists and is its user's, and that its token
	// is still valid; it ends the stream when not. Defaults to 30s.
	StreamRecheck time.Duration

	// HeaderTimeout is how long a client may take to send a request's
	// headers; past it the connection is closed. Defaults to 10s.
	HeaderTimeout time.Duration
	// ReadTimeout is how long a client may take to send a request's body,
	// from the end of its headers; past it the request gets 408 and the
	// connection is closed. Defaults to 30s.
	ReadTimeout time.Duration
	// WriteTimeout is how long a response may take, from the end of the
	// request's headers; past it the connection is closed. Event streams
	// are exempt: each of their writes gets this long instead. Defaults to
	// 30s.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before it is closed. Defaults to 2m.
	IdleTimeout time.Duration
	// MaxHeaderBytes limits a request's line and headers; larger gets 431.
	// Defaults to 16 KiB.
	MaxHeaderBytes int
	// MessagesPerMinute is how many messages one user may post per minute,
	// sustained; more get 429 with Retry-After. Defaults to 60.
	MessagesPerMinute int
	// MessageBurst is how many messages one user may post at once after a
	// quiet spell. Defaults to 20.
	MessageBurst int
	// MaxStreamsPerUser is how many live event streams one user may hold
	// open; more get 429. Defaults to 8.
	MaxStreamsPerUser int
	// MaxStreams is how many live event streams the process holds open;
	// more get 503. Defaults to 10000.
	MaxStreams int
	// MaxChatBodyBytes limits the body of POST /v1/chat, which carries
	// the chat's whole history (it is read as a stream and only its last
	// message kept); larger gets 413. Defaults to 8 MiB.
	MaxChatBodyBytes int
	// MaxChatMessages limits the messages read from the body of POST
	// /v1/chat; more get 413. Defaults to 10000.
	MaxChatMessages int
	// JWT accepts JSON Web Tokens of the application's own sign-in beside
	// Baton's tokens, wherever those are accepted: an OpenID Connect
	// provider's and a backend's HS256 tokens. Their user is
	// "<iss>|<user claim>", made on the first valid token. Defaults to
	// none: Baton's tokens only.
	JWT jwtauth.Config
	// CORSOrigins are the origins (scheme://host[:port], exactly as
	// browsers send them, no wildcard) whose pages may call every /v1
	// route from the browser. Defaults to none: no cross-origin access.
	CORSOrigins []string
	// AgentKeys are the public keys of the worker's step tokens, which
	// external agents verify; the API serves them as a JWKS at
	// GET /.well-known/jwks.json, without a token. Defaults to none: the
	// route answers 404.
	AgentKeys *jwtauth.PublicKeys
	// DoubleTexting is the policy of the conversations the API creates
	// without one (every chat of POST /v1/chat, and POST
	// /v1/conversations without "double_texting"): what a message does
	// that arrives while a turn runs. It is stored on the conversation,
	// where every producer finds it. Defaults to
	// schema.DefaultDoubleTexting (debounce).
	DoubleTexting schema.DoubleTexting

	// MaxFileBytes limits each file of a message, in bytes; larger gets
	// 413 file_too_large. Defaults to schema.DefaultMaxFileBytes (5 MiB).
	MaxFileBytes int64
	// MaxFilesPerMessage limits the files of one message; more get 413
	// too_many_files. Defaults to schema.DefaultMaxFiles (4).
	MaxFilesPerMessage int
	// MaxUserFileBytes limits what one user's files take together, each
	// distinct file counted once; past it 413 file_quota_exceeded.
	// Negative turns the quota off. Defaults to
	// schema.DefaultMaxUserFileBytes (1 GiB).
	MaxUserFileBytes int64
	// FileMediaTypes are the media types of files taken, as found in their
	// bytes (schema.SniffedMediaTypes; "image/*" for every image type);
	// others get 415 unsupported_media_type. Defaults to
	// schema.DefaultFileMediaTypes: images, PDF and plain text.
	FileMediaTypes []string
	// FileLinkTTL is how long a signed link to a file (in a chat's
	// history, for <img>, which sends no bearer token) works. Defaults to
	// DefaultFileLinkTTL (1h).
	FileLinkTTL time.Duration
	// FileStore serves the bytes of files. Defaults to
	// schema.PostgresFiles, where the producer stores them.
	FileStore schema.FileStore
}

// WithDefaults returns a copy of c with every zero field set.
func (c Config) WithDefaults() Config {
	c.Events = c.Events.WithDefaults()
	c.Quotas = c.Quotas.WithDefaults()
	if c.StreamRecheck == 0 {
		c.StreamRecheck = DefaultStreamRecheck
	}
	if c.MaxContentBytes == 0 {
		c.MaxContentBytes = DefaultMaxContentBytes
	}
	if c.DoubleTexting == "" {
		c.DoubleTexting = schema.DefaultDoubleTexting
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	setDefault(&c.HeaderTimeout, DefaultHeaderTimeout)
	setDefault(&c.ReadTimeout, DefaultReadTimeout)
	setDefault(&c.WriteTimeout, DefaultWriteTimeout)
	setDefault(&c.IdleTimeout, DefaultIdleTimeout)
	setDefault(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&c.MessagesPerMinute, DefaultMessagesPerMinute)
	setDefault(&c.MessageBurst, DefaultMessageBurst)
	setDefault(&c.MaxStreamsPerUser, DefaultMaxStreamsPerUser)
	setDefault(&c.MaxStreams, DefaultMaxStreams)
	setDefault(&c.MaxChatBodyBytes, DefaultMaxChatBodyBytes)
	setDefault(&c.MaxChatMessages, DefaultMaxChatMessages)
	setDefault(&c.FileLinkTTL, DefaultFileLinkTTL)
	limits := c.fileLimits().WithDefaults()
	c.MaxFileBytes, c.MaxFilesPerMessage, c.MaxUserFileBytes, c.FileMediaTypes = limits.MaxFileBytes, limits.MaxFiles, limits.MaxUserBytes, limits.MediaTypes
	if c.FileStore == nil {
		c.FileStore = schema.PostgresFiles{}
	}
	return c
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate reports the first setting that cannot work, as a
// *setting.Error naming the field, so that a command line can check its
// flags before it connects. It expects defaults applied (WithDefaults).
func (c Config) Validate() error {
	if c.MaxContentBytes < 1 || c.MaxContentBytes > schema.MaxContentBytes {
		return setting.Errorf("MaxContentBytes", c.MaxContentBytes, "must be 1 to %d bytes (the bound of every producer, 1 MiB)", schema.MaxContentBytes)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"HeaderTimeout", c.HeaderTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout},
	} {
		if d.v < 10*time.Millisecond {
			return setting.Errorf(d.field, d.v, "must be at least 10ms")
		}
	}
	for _, n := range []struct {
		field string
		v     int
	}{
		{"MaxHeaderBytes", c.MaxHeaderBytes}, {"MessagesPerMinute", c.MessagesPerMinute},
		{"MessageBurst", c.MessageBurst}, {"MaxStreamsPerUser", c.MaxStreamsPerUser}, {"MaxStreams", c.MaxStreams},
		{"MaxChatBodyBytes", c.MaxChatBodyBytes}, {"MaxChatMessages", c.MaxChatMessages},
	} {
		if n.v < 1 {
			return setting.Errorf(n.field, n.v, "must be at least 1")
		}
	}
	if c.MaxHeaderBytes < 1024 {
		return setting.Errorf("MaxHeaderBytes", c.MaxHeaderBytes, "must be at least 1024: a browser's ordinary headers do not fit in less")
	}
	if c.MaxChatBodyBytes < c.MaxContentBytes {
		return setting.Errorf("MaxChatBodyBytes", c.MaxChatBodyBytes, "must be at least the content limit of %d bytes: a chat's new message comes in its body", c.MaxContentBytes)
	}
	if _, err := schema.ParseDoubleTexting(string(c.DoubleTexting)); err != nil {
		return setting.Errorf("DoubleTexting", c.DoubleTexting, "is not a policy: give %s", schema.DoubleTextingNames())
	}
	if c.MaxFileBytes < 1 {
		return setting.Errorf("MaxFileBytes", c.MaxFileBytes, "must be at least 1 byte")
	}
	if c.MaxFilesPerMessage < 1 {
		return setting.Errorf("MaxFilesPerMessage", c.MaxFilesPerMessage, "must be at least 1")
	}
	for _, t := range c.FileMediaTypes {
		if err := schema.CheckMediaType(t); err != nil {
			return setting.Errorf("FileMediaTypes", strings.Join(c.FileMediaTypes, ","), "%v", err)
		}
	}
	if c.FileLinkTTL < time.Second {
		return setting.Errorf("FileLinkTTL", c.FileLinkTTL, "must be at least 1s")
	}
	if c.MaxStreamsPerUser > c.MaxStreams {
		return setting.Errorf("MaxStreamsPerUser", c.MaxStreamsPerUser, "must not exceed the process's limit of %d streams", c.MaxStreams)
	}
	if err := c.JWT.WithDefaults().Validate(); err != nil {
		return setting.Within("JWT", err)
	}
	return validateCORSOrigins(c.CORSOrigins)
}

// Server serves the API.
type Server struct {
	cfg  Config
	pool *pgxpool.Pool
	// js follows and publishes conversation events, and its connection
	// carries live deltas, stop notices and snapshot requests; nil when the
	// server runs without NATS.
	js      jetstream.JetStream
	nc      *natsclient.Conn
	log     zerolog.Logger
	metrics *metrics
	mux     *http.ServeMux
	handler http.Handler

	// messages is a token bucket per user for posting messages.
	messages *keyedlimit.Limiter[int64]
	streams  *streamLimiter
	// jwt verifies JWTs; nil when none is accepted.
	jwt *jwtauth.Verifier

	eventsCfg batonnats.EventsConfig
	events    *batonnats.EventPublisher
	hub       *hub
	closing   chan struct{}
	closeOnce sync.Once
	fileLinks fileLinks
}

// New builds a server over pool and js, both owned by the caller. js, when
// not nil, serves live conversation events (GET
// /v1/conversations/{cid}/events, the chat routes) from the events stream,
// the server publishes the changes it commits there, and its connection
// carries partial reply text to live clients and stop notices to workers.
// Without it those routes answer 503.
func New(cfg Config, pool *pgxpool.Pool, js jetstream.JetStream) (*Server, error) {
	cfg = cfg.WithDefaults()
	if pool == nil {
		return nil, errors.New("api: the pool is nil: give New a PostgreSQL pool")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pool: pool, js: js, log: *cfg.Logger, metrics: m, mux: http.NewServeMux(),
		eventsCfg: cfg.Events, closing: make(chan struct{}),
		messages: keyedlimit.New[int64](cfg.MessagesPerMinute, cfg.MessageBurst),
		streams:  newStreamLimiter(cfg.MaxStreamsPerUser, cfg.MaxStreams)}
	if s.jwt, err = jwtauth.New(cfg.JWT); err != nil {
		return nil, setting.Within("JWT", err)
	}
	if js != nil {
		s.nc = js.Conn()
		s.hub = newHub(js, s.nc, cfg.Events, s.log, m.dropped.WithLabelValues(dropSlowClient))
		s.events = batonnats.NewEventPublisher(js, cfg.Events, true)
	}
	s.routes()
	s.handler = s.cors(s.limitRequest(s.mux))
	return s, nil
}

func (s *Server) routes() {
	s.handle("GET /{$}", s.index)
	s.handle("GET /healthz", s.healthz)
	s.handle("GET /readyz", s.readyz)
	s.handle("GET /app.js", s.asset("text/javascript; charset=utf-8", appJS))
	s.handle("GET /app.css", s.asset("text/css; charset=utf-8", appCSS))
	s.handle("GET /.well-known/jwks.json", s.agentKeys)
	// Metrics are not served here: they say how busy the service is and
	// which routes fail, which is for operators, not for anyone who can
	// reach the API. `baton api --metrics-addr` serves them apart.

	s.handle("POST /v1/conversations", s.auth(s.createConversation))
	s.handle("GET /v1/conversations", s.auth(s.listConversations))
	s.handle("GET /v1/conversations/{cid}", s.auth(s.getConversation))
	s.handle("PATCH /v1/conversations/{cid}", s.auth(s.patchConversation))
	s.handle("DELETE /v1/conversations/{cid}", s.auth(s.deleteConversation))
	s.handle("POST /v1/conversations/{cid}/messages", s.auth(s.limitMessages(s.postMessage)))
	s.handle("GET /v1/conversations/{cid}/messages", s.auth(s.listMessages))
	s.handle("POST /v1/conversations/{cid}/read", s.auth(s.markRead))
	s.handle("POST /v1/conversations/{cid}/retry", s.auth(s.retryFailed))
	s.handle("GET /v1/conversations/{cid}/events", s.liveStream(s.authStream(s.conversationEvents)))
	s.handle("POST /v1/conversations/{cid}/stop", s.auth(s.stopConversation))
	// The AI SDK's useChat (chat.go).
	s.handle("POST /v1/chat", s.auth(s.limitMessages(s.postChat)))
	s.handle("GET /v1/chat/{id}", s.auth(s.chatHistory))
	s.handle("GET /v1/chat/{id}/stream", s.auth(s.resumeChat))
	// A file: with the owner's token, or a signed link (files.go).
	s.handle("GET /v1/files/{sha256}", s.getFile)
	s.handle("GET /v1/conversations/{cid}/approvals", s.auth(s.listApprovals))
	s.handle("POST /v1/conversations/{cid}/approvals/{id}", s.auth(s.decideApproval))
	// Anything else is a JSON error, not the mux's plain text: 405 with
	// Allow for a route that takes other methods, 404 otherwise.
	s.handle("/v1/", s.unrouted)
	s.handle("/", s.unrouted)
}

// routeMethods are the methods a route may be registered for.
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// unrouted answers a request no route takes: 405 with the methods the
// path's routes take in Allow, or 404 when no route has its path.
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range routeMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" && pattern != "/v1/" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed",
		fmt.Sprintf("%s is not allowed on %s: use %s", r.Method, r.URL.Path, strings.Join(allow, " or ")))
}

// handle registers h under pattern with request metrics.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.mux.Handle(pattern, s.instrument(pattern, h))
}

// Close ends the open event streams, so that a graceful shutdown does not
// wait for clients that never hang up. Register it with
// http.Server.RegisterOnShutdown.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		if s.hub != nil {
			s.hub.close()
		}
	})
}

// JWT returns the verifier of JWTs, or nil when none is accepted.
func (s *Server) JWT() *jwtauth.Verifier { return s.jwt }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		// The cause (driver text, host and port) is for operators only.
		s.log.Warn().Err(err).Msg("not ready: the database is not reachable")
		writeError(w, http.StatusServiceUnavailable, "not_ready", "not ready to serve requests")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
