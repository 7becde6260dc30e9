// Package console is Baton's operator console: a process of its own
// (`baton console`), with a PostgreSQL role of its own (baton_console),
// that shows what Baton is doing and lets an operator fix it. It reads
// what it shows, and writes only through the operator's paths: a retry of
// a failed turn (the user's own, schema.RetryFailedTx, or going on from
// the turn's journal once an unknown outcome was recorded), the outcome of
// a write whose outcome was unknown, a dead letter discarded or marked for
// retry (which its group's process applies), and the record of what
// operators did and viewed (operator_actions).
//
// Pages are rendered on the server with html/template; a small script
// library (htmx, vendored under static/) refreshes parts of them. No page
// runs inline script: the Content-Security-Policy allows scripts from the
// console's own origin only.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/keyedlimit"
	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/schema"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// DB is what the console needs of PostgreSQL: queries and transactions
// (*pgxpool.Pool).
type DB interface {
	schema.Beginner
}

// Server is the operator console.
type Server struct {
	cfg     Config
	db      DB
	js      jetstream.JetStream
	jwt     *jwtauth.Verifier
	log     zerolog.Logger
	signIns *keyedlimit.Limiter[string]
	pages   map[string]*template.Template
	mux     *http.ServeMux

	// overview is the overview's data, gathered at most once per refresh
	// interval whatever the number of open tabs.
	overview struct {
		sync.Mutex
		at      time.Time
		data    *overviewData
		gathers int64
	}
}

// New returns the console over db and js (nil when NATS cannot be
// reached: the overview says so).
func New(cfg Config, db DB, js jetstream.JetStream) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, db: db, js: js, log: *cfg.Logger, signIns: keyedlimit.New[string](cfg.SignInPerMinute, cfg.SignInBurst)}
	if cfg.JWT.Enabled() {
		jwtCfg := cfg.JWT
		jwtCfg.Logger = cfg.Logger
		v, err := jwtauth.New(jwtCfg)
		if err != nil {
			return nil, err
		}
		s.jwt = v
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	s.routes()
	return s, nil
}

// Handler serves the console.
func (s *Server) Handler() http.Handler { return securityHeaders(s.mux) }

// HTTPServer returns an http.Server for the console, with timeouts that a
// slow or idle client cannot hold open.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// Run deletes the sessions that ended, every half idle timeout, until ctx
// ends.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.SessionIdle / 2)
	defer t.Stop()
	for {
		if _, err := schema.PruneConsoleSessions(ctx, s.db, s.cfg.SessionIdle, 1000); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("cannot delete ended sessions; trying again later")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// access says who may reach a route.
type access int

const (
	// accessPublic: the sign-in page, health checks and the static files, which
	// show nothing of Baton.
	accessPublic access = iota
	// accessOperator: an operator with a live session, viewer or admin; a POST
	// also needs the session's CSRF token.
	accessOperator
	// accessAdmin: an admin's session and the CSRF token; a viewer gets 403.
	accessAdmin
)

// route is a route of the console and who may reach it. Every route is
// in routeTable, so that a test can try each one without a session.
type route struct {
	pattern string
	access  access
	handler http.Handler
}

func (s *Server) routeTable() []route {
	static, _ := fs.Sub(staticFiles, "static")
	return []route{
		{"GET /static/", accessPublic, http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static)))},
		{"GET /healthz", accessPublic, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })},
		{"GET /readyz", accessPublic, http.HandlerFunc(s.ready)},

		{"GET /signin", accessPublic, http.HandlerFunc(s.signInPage)},
		{"POST /signin", accessPublic, http.HandlerFunc(s.signIn)},
		{"POST /signout", accessOperator, http.HandlerFunc(s.signOut)},

		{"GET /{$}", accessOperator, http.HandlerFunc(s.overviewPage)},
		{"GET /overview/live", accessOperator, http.HandlerFunc(s.overviewLive)},
		{"GET /conversations", accessOperator, http.HandlerFunc(s.conversationsPage)},
		{"GET /conversations/{key}", accessOperator, http.HandlerFunc(s.conversationPage)},
		{"GET /conversations/{key}/live", accessOperator, http.HandlerFunc(s.conversationLive)},
		{"POST /conversations/{key}/retry", accessAdmin, http.HandlerFunc(s.retryTurn)},
		{"POST /conversations/{key}/operations/{id}/outcome", accessAdmin, http.HandlerFunc(s.recordOutcome)},
		{"GET /turns", accessOperator, http.HandlerFunc(s.turnsPage)},
		{"GET /dead-letters", accessOperator, http.HandlerFunc(s.deadLettersPage)},
		{"GET /dead-letters/{group}", accessOperator, http.HandlerFunc(s.groupDeadLettersPage)},
		{"POST /dead-letters/{group}/{id}/discard", accessAdmin, http.HandlerFunc(s.discardDeadLetter)},
		{"POST /dead-letters/{group}/{id}/retry", accessAdmin, http.HandlerFunc(s.retryDeadLetter)},
		{"GET /actions", accessOperator, http.HandlerFunc(s.actionsPage)},
	}
}

func (s *Server) routes() {
	m := http.NewServeMux()
	for _, rt := range s.routeTable() {
		h := rt.handler
		switch rt.access {
		case accessOperator:
			h = s.signedIn(h.ServeHTTP)
		case accessAdmin:
			h = s.admin(h.ServeHTTP)
		}
		m.Handle(rt.pattern, h)
	}
	s.mux = m
}

// ready answers 200 while PostgreSQL answers.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var one int
	if err := s.db.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		http.Error(w, "PostgreSQL is not reachable", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// contentSecurityPolicy allows nothing but the console's own scripts,
// styles and forms: no inline script, no frame, no other origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// securityHeaders sets the headers every answer carries.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// cacheStatic lets browsers keep the script and the style sheet for an
// hour: they change only with the binary.
func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// inTx runs f in a transaction that commits when f returns nil.
func (s *Server) inTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, f)
}

// failed answers an error that is not the operator's doing: logged, and
// shown without its details (they may name a server or a setting).
func (s *Server) failed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return
	}
	s.log.Error().Err(err).Str("path", r.URL.Path).Msg("console request failed")
	s.errorPage(w, r, http.StatusInternalServerError, "Something went wrong on the console's side; its log says what.")
}

// errorPage answers status with a page that says msg.
func (s *Server) errorPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	sess := sessionFrom(r.Context())
	s.render(w, r, status, "error", view{Title: http.StatusText(status), Message: msg, Session: sess})
}

// redirect sends the browser to path (one of the console's) after an
// action, with the code of a notice the page shows.
func redirect(w http.ResponseWriter, r *http.Request, path, notice string) {
	if !localPath(path) {
		path = "/"
	}
	if notice != "" {
		path += "?notice=" + notice
	}
	http.Redirect(w, r, path, http.StatusSeeOther)
}
