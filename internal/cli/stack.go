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
// Pool, NATS and JetStream are filled into both.
type StackConfig struct {
	Pool   *pgxpool.Pool
	NATS   *natsclient.Conn
	Events batonnats.EventsConfig
	Relay  relay.Config
	Worker consumer.Config
	Log    zerolog.Logger
	// PruneEvery, when positive, prunes by Retention that often while the
	// relay holds its slot, as `baton relay` does; its metrics go to the
	// relay's registerer.
	PruneEvery time.Duration
	Retention  schema.Retention
}

// RunStack runs the relay and a worker in one process over one PostgreSQL
// pool and one NATS connection, until ctx ends or one fails: what `baton
// dev` runs beside the API, and what end-to-end tests drive.
func RunStack(ctx context.Context, cfg StackConfig) error {
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return err
	}
	rl, err := relay.New(cfg.Relay, cfg.Pool, cfg.NATS, cfg.Log.With().Str("component", "relay").Logger())
	if err != nil {
		return err
	}
	wcfg := cfg.Worker
	wcfg.Pool = cfg.Pool
	wcfg.JetStream = js
	wcfg.Stream = cfg.Relay.Stream
	wlog := cfg.Log.With().Str("component", "worker").Logger()
	wcfg.Logger = &wlog
	var events *consumer.EventPublisher
	if wcfg.OnConversationEvent == nil {
		if events, err = consumer.NewEventPublisher(js, cfg.Events, wlog); err != nil {
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
		p, err := newPruner(cfg.Pool, cfg.NATS, cfg.Relay.Stream.WithDefaults().Name, cfg.Retention, cfg.PruneEvery, reg, cfg.Log)
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
		w, err := consumer.New(wcfg)
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
