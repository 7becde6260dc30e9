package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// registerNATSConnected exports whether nc is connected to NATS, the
// series the alert on NATS being unreachable watches. Registered again
// (the API's default registry, in a process that runs it twice), it
// replaces the earlier connection's.
func registerNATSConnected(reg prometheus.Registerer, nc *natsclient.Conn) {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_nats_connected",
		Help: "1 while this process is connected to NATS, 0 while it is not (it reconnects in the background).",
	}, func() float64 {
		if nc.IsConnected() {
			return 1
		}
		return 0
	})
	if err := reg.Register(g); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			reg.Unregister(already.ExistingCollector)
			_ = reg.Register(g)
		}
	}
}

// serveMetrics serves g on http://addr/metrics for a service without an
// HTTP API of its own (relay, worker). The returned stop shuts the server
// down and waits for it.
func serveMetrics(addr string, g prometheus.Gatherer, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--metrics-addr / BATON_METRICS_ADDR %q: %w", addr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving metrics at /metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}, nil
}
