package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/config"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// httpOptions are the API server's own settings.
type httpOptions struct {
	HTTPAddr        string `name:"http-addr" env:"BATON_HTTP_ADDR" help:"Address the HTTP API listens on." default:"${http_addr}"`
	MaxContentBytes int    `name:"max-content-bytes" env:"BATON_MAX_CONTENT_BYTES" help:"Largest message content accepted, in bytes (larger gets 413)." default:"65536"`
	quotaFlags      `embed:""`
	limitFlags      `embed:""`
	jwtFlags        `embed:""`
	CORSOrigins     []string `name:"cors-origins" env:"BATON_CORS_ORIGINS" sep:"," setting:"CORSOrigins" placeholder:"ORIGIN" help:"Origins whose pages may call the API from the browser, exactly (https://app.example), comma-separated; no wildcard. Default: none, no cross-origin access."`
	DoubleTexting   string   `name:"double-texting" env:"BATON_DOUBLE_TEXTING" setting:"DoubleTexting" placeholder:"POLICY" help:"What a message does that arrives while a turn of its conversation runs, for the conversations the API creates without a policy of their own (every chat of POST /v1/chat): enqueue (answered after the running turn, one reply per message), reject (409 turn_running, nothing written), interrupt (the running turn stops with what it wrote, then one turn answers its messages and the new one) or debounce (a message within the worker's --debounce replaces the running turn, one reply for both). Stored on each conversation, which PATCH /v1/conversations/{cid} changes. Defaults to ${double_texting}."`
	AgentPublicKeys []string `name:"agent-public-key" env:"BATON_AGENT_PUBLIC_KEY" sep:"," type:"path" placeholder:"FILE" help:"An Ed25519 public key (PEM) of the worker's --agent-signing-key, served to external agents as a JWKS at /.well-known/jwks.json so that they can verify its requests; repeatable for a rotation (the variable separates files with ','). A private key file gives its public half. Default: none, the route answers 404 (baton dev serves the key it keeps under --dir besides)."`
}

// limitFlags are the HTTP edge's limits, shared by `baton api` and `baton
// dev`. A flag left out means the API's default.
type limitFlags struct {
	HeaderTimeout     time.Duration `name:"header-timeout" env:"BATON_HTTP_HEADER_TIMEOUT" setting:"HeaderTimeout" help:"How long a client may take to send a request's headers; past it the connection is closed. Defaults to ${http_header_timeout}."`
	ReadTimeout       time.Duration `name:"read-timeout" env:"BATON_HTTP_READ_TIMEOUT" setting:"ReadTimeout" help:"How long a client may take to send a request's body, from the end of its headers; past it 408 and the connection is closed. Defaults to ${http_read_timeout}."`
	WriteTimeout      time.Duration `name:"write-timeout" env:"BATON_HTTP_WRITE_TIMEOUT" setting:"WriteTimeout" help:"How long a response may take; past it the connection is closed. Event streams are exempt: each of their writes gets this long. Defaults to ${http_write_timeout}."`
	IdleTimeout       time.Duration `name:"idle-timeout" env:"BATON_HTTP_IDLE_TIMEOUT" setting:"IdleTimeout" help:"How long a keep-alive connection may wait for its next request. Defaults to ${http_idle_timeout}."`
	MaxHeaderBytes    int           `name:"max-header-bytes" env:"BATON_MAX_HEADER_BYTES" setting:"MaxHeaderBytes" help:"Largest request line and headers, in bytes; larger gets 431. Defaults to ${max_header_bytes}."`
	MessagesPerMinute int           `name:"messages-per-minute" env:"BATON_MESSAGES_PER_MINUTE" setting:"MessagesPerMinute" help:"Messages one user may post per minute, sustained; more get 429 with Retry-After. Defaults to ${messages_per_minute}."`
	MessageBurst      int           `name:"message-burst" env:"BATON_MESSAGE_BURST" setting:"MessageBurst" help:"Messages one user may post at once after a quiet spell. Defaults to ${message_burst}."`
	MaxStreamsPerUser int           `name:"max-streams-per-user" env:"BATON_MAX_STREAMS_PER_USER" setting:"MaxStreamsPerUser" help:"Live event streams one user may hold open; one more gets 429. Defaults to ${streams_per_user}."`
	MaxStreams        int           `name:"max-streams" env:"BATON_MAX_STREAMS" setting:"MaxStreams" help:"Live event streams this process holds open; one more gets 503. Defaults to ${max_streams}."`
	MaxChatBodyBytes  int           `name:"max-chat-body-bytes" env:"BATON_MAX_CHAT_BODY_BYTES" setting:"MaxChatBodyBytes" help:"Largest body of POST /v1/chat, which carries the chat's whole history (only its last message is kept); larger gets 413. Defaults to ${max_chat_body_bytes}."`
	MaxChatMessages   int           `name:"max-chat-messages" env:"BATON_MAX_CHAT_MESSAGES" setting:"MaxChatMessages" help:"Messages read from the body of POST /v1/chat; more get 413. Defaults to ${max_chat_messages}."`
	MetricsAddr       string        `name:"metrics-addr" env:"BATON_METRICS_ADDR" help:"Address to serve Prometheus metrics on /metrics, apart from the API, such as 127.0.0.1:9090. Default: not served."`
}

// withLimits returns cfg with the limits set.
func (l limitFlags) withLimits(cfg api.Config) api.Config {
	cfg.HeaderTimeout, cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout = l.HeaderTimeout, l.ReadTimeout, l.WriteTimeout, l.IdleTimeout
	cfg.MaxHeaderBytes = l.MaxHeaderBytes
	cfg.MessagesPerMinute, cfg.MessageBurst = l.MessagesPerMinute, l.MessageBurst
	cfg.MaxStreamsPerUser, cfg.MaxStreams = l.MaxStreamsPerUser, l.MaxStreams
	cfg.MaxChatBodyBytes, cfg.MaxChatMessages = l.MaxChatBodyBytes, l.MaxChatMessages
	return cfg
}

// validate checks the limits before anything connects, naming the flag
// and the variable of a value that cannot work.
func (l limitFlags) validate() error {
	return settingError(l, l.withLimits(api.Config{}).WithDefaults().Validate())
}

func (o httpOptions) validate() error {
	if _, _, err := net.SplitHostPort(o.HTTPAddr); err != nil {
		return fmt.Errorf("--http-addr / BATON_HTTP_ADDR %q is not host:port (for example 127.0.0.1:8080)", o.HTTPAddr)
	}
	if o.MaxContentBytes < 1 || o.MaxContentBytes > schema.MaxContentBytes {
		return fmt.Errorf("--max-content-bytes / BATON_MAX_CONTENT_BYTES must be 1 to %d (1 MiB, the bound of every producer), not %d", schema.MaxContentBytes, o.MaxContentBytes)
	}
	if _, err := schema.ParseDoubleTexting(o.DoubleTexting); o.DoubleTexting != "" && err != nil {
		return fmt.Errorf("--double-texting / BATON_DOUBLE_TEXTING %q is not a policy: give %s", o.DoubleTexting, schema.DoubleTextingNames())
	}
	return nil
}

type apiCmd struct {
	config.Database
	config.NATS
	httpOptions
	AllowRetentionShrink bool `name:"allow-retention-shrink" env:"BATON_ALLOW_RETENTION_SHRINK" help:"Let the API reduce the events stream's replicas; without it, a reduction is refused (the stream is left as it is)."`
	Replicas             int  `name:"replicas" env:"BATON_REPLICAS" help:"Stream replicas, here of the conversation events stream (the same setting as the relay's)." default:"${replicas}"`
}

func (c *apiCmd) Run(ctx context.Context, env *Env) error {
	if err := c.httpOptions.validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.limitFlags.validate(); err != nil {
		return err
	}
	log := env.Log.With().Str("component", "api").Logger()
	// A registry of its own, as every other component has: two APIs in one
	// process (tests, a program that embeds the CLI) never register the
	// same collector twice.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Checked before anything connects: a sign-in setting that cannot
	// work is a usage error.
	cfg, err := apiSignIn(c, c.jwtFlags, c.CORSOrigins, c.withLimits(api.Config{
		MaxContentBytes: c.MaxContentBytes,
		Quotas:          c.apiQuotas(),
		StreamRecheck:   c.StreamRecheck,
		DoubleTexting:   schema.DoubleTexting(c.DoubleTexting),
		Logger:          &log,
		Registerer:      reg,
	}), log)
	if err != nil {
		return err
	}
	if cfg.AgentKeys, err = agentPublicKeys(c.AgentPublicKeys); err != nil {
		return err
	}
	defer startTracing(ctx, "api", log)()
	pool, err := openServicePool(ctx, c.Database, 0, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := listen(c.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	nc, js, closeNATS, err := connectLiveNATS(ctx, c.NATS.Options("api"), batonnats.EventsConfig{Replicas: c.Replicas}, c.AllowRetentionShrink, log)
	if err != nil {
		return err
	}
	defer closeNATS()
	registerNATSConnected(reg, nc)
	cfg.Events = batonnats.EventsConfig{Replicas: c.Replicas}
	srv, err := api.New(cfg, pool, js)
	if err != nil {
		return err
	}
	logSignIn(ctx, srv, c.CORSOrigins, log)
	logAgentKeys(cfg.AgentKeys, log)
	if c.MetricsAddr != "" {
		stop, err := serveMetrics(c.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	log.Info().Str("addr", ln.Addr().String()).Msg("serving HTTP API")
	return serveHTTP(ctx, ln, srv.HTTPServer())
}

// listen binds addr, turning "address in use" into an error that says
// which flag chooses another one.
func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("address %s is already in use: stop what runs there or choose another with --http-addr / BATON_HTTP_ADDR", addr)
	}
	return ln, err
}

// serveHTTP serves hs on ln until ctx is cancelled, then gives in-flight
// requests ten seconds to finish (hs ends its event streams, which never
// end on their own).
func serveHTTP(ctx context.Context, ln net.Listener, hs *http.Server) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	<-errc
	return err
}
