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

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/config"
	batonnats "github.com/batonhq/baton/nats"
)

// httpOptions are the API server's own settings.
type httpOptions struct {
	HTTPAddr        string `name:"http-addr" env:"BATON_HTTP_ADDR" help:"Address the HTTP API listens on." default:"${http_addr}"`
	MaxContentBytes int    `name:"max-content-bytes" env:"BATON_MAX_CONTENT_BYTES" help:"Largest message content accepted, in bytes (larger gets 413)." default:"65536"`
}

func (o httpOptions) validate() error {
	if _, _, err := net.SplitHostPort(o.HTTPAddr); err != nil {
		return fmt.Errorf("--http-addr / BATON_HTTP_ADDR %q is not host:port (for example 127.0.0.1:8080)", o.HTTPAddr)
	}
	if o.MaxContentBytes < 1 {
		return fmt.Errorf("--max-content-bytes / BATON_MAX_CONTENT_BYTES must be at least 1, not %d", o.MaxContentBytes)
	}
	return nil
}

type apiCmd struct {
	config.Database
	config.NATS
	httpOptions
	Replicas int `name:"replicas" env:"BATON_REPLICAS" help:"Stream replicas, here of the conversation events stream (the same setting as the relay's)." default:"${replicas}"`
}

func (c *apiCmd) Run(ctx context.Context, env *Env) error {
	if err := c.httpOptions.validate(); err != nil {
		return &UsageError{Err: err}
	}
	log := env.Log.With().Str("component", "api").Logger()
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := listen(c.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()
	nc, js, closeNATS, err := connectLiveNATS(ctx, c.NATSURL, "baton api", batonnats.EventsConfig{Replicas: c.Replicas}, log)
	if err != nil {
		return &UsageError{Err: err}
	}
	defer closeNATS()
	srv, err := api.New(api.Config{
		JetStream:       js,
		NATS:            nc,
		Events:          batonnats.EventsConfig{Replicas: c.Replicas},
		Pool:            pool,
		MaxContentBytes: c.MaxContentBytes,
		Log:             log,
		Registerer:      prometheus.DefaultRegisterer,
		Gatherer:        prometheus.DefaultGatherer,
	})
	if err != nil {
		return err
	}
	log.Info().Str("addr", ln.Addr().String()).Msg("serving HTTP API")
	return serveHTTP(ctx, ln, srv)
}

// apiServer is what serveHTTP needs of the API: a handler whose live
// streams can be closed at shutdown.
type apiServer interface {
	http.Handler
	Close()
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

// serveHTTP serves h on ln until ctx is cancelled, then gives in-flight
// requests ten seconds to finish.
func serveHTTP(ctx context.Context, ln net.Listener, h apiServer) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	// Event streams never end on their own: close them when shutting down.
	hs.RegisterOnShutdown(h.Close)
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
