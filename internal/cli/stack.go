package cli

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/batonhq/baton/consumer"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// StackConfig is the relay's and the worker's configuration for RunStack.
// It holds settings only: the pool and the NATS connection come to
// RunStack, which gives them to both.
type StackConfig struct {
	// Events is the conversation events stream the worker publishes to.
	// Defaults to nats.EventsConfig's defaults.
	Events batonnats.EventsConfig
	// Relay configures the relay; its Logger is set from Logger. Defaults
	// to relay.Config's defaults.
	Relay relay.Config
	// Worker configures the worker; its Logger is set from Logger.
	// Defaults to consumer.Config's defaults.
	Worker consumer.Config
	// Logger receives the logs of the relay, the worker and the pruner,
	// each under its component. Defaults to no logging.
	Logger *zerolog.Logger
	// PruneEvery, when positive, prunes by Retention that often while the
	// relay holds its slot, as `baton relay` does; its metrics go to the
	// relay's registerer. Defaults to 0: no pruning.
	PruneEvery time.Duration
	// Retention is what pruning keeps. Defaults to schema.Retention's
	// defaults.
	Retention schema.Retention
}

// RunStack runs the relay and a worker in one process over pool and nc,
// both owned by the caller, until ctx ends or one fails: what `baton dev`
// runs beside the API, and what end-to-end tests drive.
func RunStack(ctx context.Context, cfg StackConfig, pool *pgxpool.Pool, nc *natsclient.Conn) error {
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	rcfg := cfg.Relay
	rlog := log.With().Str("component", "relay").Logger()
	rcfg.Logger = &rlog
	rl, err := relay.New(rcfg, pool, nc)
	if err != nil {
		return err
	}
	wcfg := cfg.Worker
	wcfg.Stream = cfg.Relay.Stream
	wlog := log.With().Str("component", "worker").Logger()
	wcfg.Logger = &wlog
	var events *consumer.EventPublisher
	if wcfg.OnConversationEvent == nil {
		if events, err = consumer.NewEventPublisher(consumer.EventPublisherConfig{Events: cfg.Events, Logger: &wlog}, js); err != nil {
			return err
		}
		wcfg.OnConversationEvent = events.Publish
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return rl.Run(gctx) })
	if cfg.PruneEvery > 0 {
		reg := cfg.Relay.Registerer
		if reg == nil {
			reg = prometheus.NewRegistry()
		}
		p, err := newPruner(pool, nc, cfg.Relay.Stream.WithDefaults().Name, cfg.Retention, cfg.PruneEvery, reg, log)
		if err != nil {
			return err
		}
		g.Go(func() error {
			p.run(gctx, rl.Active)
			return nil
		})
	}
	g.Go(func() error {
		// The relay provisions the outbox stream; the worker needs it
		// before it can create its consumer.
		if err := waitForStream(gctx, js, cfg.Relay.Stream.WithDefaults().Name); err != nil {
			return err
		}
		w, err := consumer.New(wcfg, pool, js)
		if err != nil {
			return err
		}
		err = w.Run(gctx)
		if events != nil {
			events.Stop()
		}
		return err
	})
	err = g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

func waitForStream(ctx context.Context, js jetstream.JetStream, name string) error {
	for backoff := 20 * time.Millisecond; ; backoff = min(backoff*2, time.Second) {
		// Not found yet, or NATS down for a moment: keep waiting.
		if _, err := js.Stream(ctx, name); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}
