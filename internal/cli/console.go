package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/internal/config"
)

// consoleCmd is `baton console`: the operator console, a process of its
// own that can stay on a private network, as baton_console in PostgreSQL
// and the console user of NATS (read-only stream and consumer info).
type consoleCmd struct {
	config.Database
	config.NATS
	config.Stream
	config.Replication
	Addr            string        `name:"addr" env:"BATON_CONSOLE_ADDR" default:"${console_addr}" help:"Address the console listens on (HOST:PORT); keep it on a private network."`
	TLSCert         string        `name:"tls-cert" env:"BATON_CONSOLE_TLS_CERT" type:"path" placeholder:"FILE" help:"Serve HTTPS with this certificate (PEM, with its chain); needs --tls-key. Default: plain HTTP, for a proxy that ends TLS (then set --secure-cookies)."`
	TLSKey          string        `name:"tls-key" env:"BATON_CONSOLE_TLS_KEY" type:"path" placeholder:"FILE" help:"The private key of --tls-cert (PEM)."`
	SecureCookies   bool          `name:"secure-cookies" env:"BATON_CONSOLE_SECURE_COOKIES" setting:"SecureCookies" help:"Mark the session cookie Secure also over plain HTTP: behind a proxy that ends TLS. Over TLS it always is."`
	HideContent     bool          `name:"hide-content" env:"BATON_CONSOLE_HIDE_CONTENT" setting:"HideContent" help:"Show metadata only: no message text, tool arguments or results, step answers or dead letter payloads."`
	SessionIdle     time.Duration `name:"session-idle" env:"BATON_CONSOLE_SESSION_IDLE" setting:"SessionIdle" help:"How long a session may go unused before it ends. Defaults to ${console_session_idle}."`
	SessionMaxAge   time.Duration `name:"session-max-age" env:"BATON_CONSOLE_SESSION_MAX_AGE" setting:"SessionMaxAge" help:"How long a session lasts at most (never longer than the JWT it came from). Defaults to ${console_session_max_age}."`
	Refresh         time.Duration `name:"refresh" env:"BATON_CONSOLE_REFRESH" setting:"RefreshInterval" help:"How often open pages refresh, and how long the overview's data is kept: however many tabs are open, PostgreSQL and NATS are asked once per interval. Defaults to ${console_refresh}."`
	SignInPerMinute int           `name:"sign-in-per-minute" env:"BATON_CONSOLE_SIGN_IN_PER_MINUTE" setting:"SignInPerMinute" help:"Sign-in attempts one client address may make per minute, after a burst of --sign-in-burst. Defaults to ${console_sign_ins}."`
	SignInBurst     int           `name:"sign-in-burst" env:"BATON_CONSOLE_SIGN_IN_BURST" setting:"SignInBurst" help:"Sign-in attempts one client address may make at once. Defaults to ${console_sign_in_burst}."`
	LeaseGrace      time.Duration `name:"lease-grace" env:"BATON_CONSOLE_LEASE_GRACE" setting:"LeaseGrace" help:"How long past its expiry a lease may stay held before its turn counts as stuck. Defaults to ${console_lease_grace}."`
	PendingAfter    time.Duration `name:"pending-after" env:"BATON_CONSOLE_PENDING_AFTER" setting:"PendingAfter" help:"How long a message may wait unclaimed since its last announcement before its turn counts as stuck. Defaults to ${console_pending_after}."`
	ApprovalAfter   time.Duration `name:"approval-after" env:"BATON_CONSOLE_APPROVAL_AFTER" setting:"ApprovalAfter" help:"How long a call or a question may wait for a person before its turn counts as stuck. Defaults to ${console_approval_after}."`
	MaxLagBytes     int64         `name:"max-lag-bytes" env:"BATON_CONSOLE_MAX_LAG_BYTES" setting:"MaxLagBytes" help:"Slot lag (bytes) above which the overview says the relay needs attention. Defaults to ${console_max_lag}."`
	PageSize        int           `name:"page-size" env:"BATON_CONSOLE_PAGE_SIZE" setting:"PageSize" help:"Rows a page lists (conversations, failed turns, messages, dead letters, actions): 1 to 1000. Defaults to ${console_page_size}."`
	JWTAdminClaim   string        `name:"jwt-admin-claim" env:"BATON_CONSOLE_JWT_ADMIN_CLAIM" setting:"AdminClaim" placeholder:"NAME=VALUE" help:"A JWT whose claim NAME holds VALUE (a string, or an element of an array; NAME may be a dotted path such as realm_access.roles) signs in an admin. Needs the --jwt-* settings. Default: none."`
	JWTViewerClaim  string        `name:"jwt-viewer-claim" env:"BATON_CONSOLE_JWT_VIEWER_CLAIM" setting:"ViewerClaim" placeholder:"NAME=VALUE" help:"A JWT whose claim NAME holds VALUE signs in a viewer, who reads only. Default: none."`
	// Whose JWTs sign operators in, with the API's settings.
	jwtFlags `embed:""`
}

func (c *consoleCmd) Run(ctx context.Context, env *Env) error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return &UsageError{Err: fmt.Errorf("--addr / BATON_CONSOLE_ADDR %q is not HOST:PORT (for example 127.0.0.1:8090)", c.Addr)}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return &UsageError{Err: errors.New("--tls-cert / BATON_CONSOLE_TLS_CERT and --tls-key / BATON_CONSOLE_TLS_KEY go together: give both, or neither for plain HTTP behind a proxy that ends TLS")}
	}
	if err := c.Replication.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	log := env.Log.With().Str("component", "console").Logger()
	cfg := console.Config{
		SessionIdle: c.SessionIdle, SessionMaxAge: c.SessionMaxAge, RefreshInterval: c.Refresh,
		SignInPerMinute: c.SignInPerMinute, SignInBurst: c.SignInBurst, SecureCookies: c.SecureCookies,
		HideContent: c.HideContent, LeaseGrace: c.LeaseGrace, PendingAfter: c.PendingAfter, ApprovalAfter: c.ApprovalAfter,
		MaxLagBytes: c.MaxLagBytes, PageSize: c.PageSize, Slot: c.Slot, Stream: c.StreamConfig().WithDefaults().Name, Logger: &log,
	}
	var err error
	if c.JWTAdminClaim != "" {
		if cfg.AdminClaim, err = console.ParseClaim(c.JWTAdminClaim); err != nil {
			return &UsageError{Err: fmt.Errorf("--jwt-admin-claim / BATON_CONSOLE_JWT_ADMIN_CLAIM: %w", err)}
		}
	}
	if c.JWTViewerClaim != "" {
		if cfg.ViewerClaim, err = console.ParseClaim(c.JWTViewerClaim); err != nil {
			return &UsageError{Err: fmt.Errorf("--jwt-viewer-claim / BATON_CONSOLE_JWT_VIEWER_CLAIM: %w", err)}
		}
	}
	if cfg.JWT, err = c.jwtConfig(); err != nil {
		return err
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		return settingError(c, err)
	}
	var tlsCfg *tls.Config
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return &UsageError{Err: fmt.Errorf("--tls-cert and --tls-key: cannot load the pair: %w", err)}
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	pool, err := openServicePool(ctx, c.Database, 8, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	// NATS only feeds the overview's stream and groups: the console works
	// without it, and connects when it can.
	nc, err := connectNATS(c.NATS.Options("console"), log, natsclient.RetryOnFailedConnect(true), natsclient.ReconnectWait(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	srv, err := console.New(cfg, pool, js)
	if err != nil {
		return settingError(c, err)
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("--addr / BATON_CONSOLE_ADDR %s: %w", c.Addr, err)
	}
	hs := srv.HTTPServer()
	scheme := "http"
	if tlsCfg != nil {
		hs.TLSConfig = tlsCfg
		ln = tls.NewListener(ln, tlsCfg)
		scheme = "https"
	}
	defer ln.Close()
	logSignInConsole(cfg, log)
	log.Info().Str("addr", ln.Addr().String()).Str("scheme", scheme).Bool("hide_content", c.HideContent).Msg("serving the operator console")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(gctx) })
	g.Go(func() error {
		err := serveHTTP(gctx, ln, hs)
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	return g.Wait()
}

// logSignInConsole says at start how operators sign in, never a secret.
func logSignInConsole(cfg console.Config, log zerolog.Logger) {
	if !cfg.JWT.Enabled() {
		log.Info().Msg("sign-in: operator tokens only")
		return
	}
	log.Info().Str("issuer", cfg.JWT.Issuer).Str("hs256_issuer", cfg.JWT.HS256Issuer).Str("audience", cfg.JWT.Audience).
		Str("admin_claim", cfg.AdminClaim.String()).Str("viewer_claim", cfg.ViewerClaim.String()).
		Msg("sign-in: operator tokens and JWTs whose claims name an operator")
}

// DefaultConsoleAddr is where `baton console` listens unless told: the
// loopback interface only, since the console belongs on a private network.
const DefaultConsoleAddr = "127.0.0.1:8090"
