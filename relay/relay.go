// Package relay tails inserts into agent_outbox through a persistent logical
// replication slot (pgoutput) and publishes one trigger per row to NATS
// JetStream, on the conversation's subject. It confirms a position to the
// slot only once JetStream acknowledged every event up to it, so a crash of
// the relay, the broker or the database loses nothing: the slot resends
// from the confirmed position and the events' Nats-Msg-Id lets JetStream drop
// the copies it already holds.
//
// The relay also carries announcements (schema.AnnounceTx) that recovery and the
// sweeper commit with their row changes, writes a heartbeat so an idle
// outbox does not pin WAL, and sweeps for pending rows nobody claimed in
// time.
package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Relay moves outbox inserts from a replication slot to JetStream.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	nc      *natsclient.Conn
	log     zerolog.Logger
	metrics *metrics
	repl    *pgconn.Config
	// api makes JetStream API calls; each session publishes through a
	// JetStream context of its own, dropped with its pending futures.
	api jetstream.JetStream

	running atomic.Bool
	// active is true while this relay holds the slot and streams.
	active atomic.Bool

	// What observeStream last saw (heartbeat loop only).
	consumersSeen       map[string]bool
	consumerListRefused bool
	// progressUnrecorded is true once the slot's progress could not be
	// recorded, warned about once (heartbeat loop only).
	progressUnrecorded bool

	// onAck, when set, sees every acknowledged event: the benchmark
	// measures commit-to-ack latency with it.
	onAck func(t batonnats.Trigger, commitTime, ackTime time.Time)
}

// New returns a relay over pool (normal queries, and the settings of the
// replication connection it opens itself) and nc, both owned by the
// caller. A NATS connection that buffers publications while it reconnects
// only delays failures; give one made with natsclient.ReconnectBufSize(-1).
func New(cfg Config, pool *pgxpool.Pool, nc *natsclient.Conn) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case pool == nil:
		return nil, errors.New("relay: the pool is nil: give New a PostgreSQL pool")
	case nc == nil:
		return nil, errors.New("relay: the NATS connection is nil: give New one (natsclient.Connect with natsclient.ReconnectBufSize(-1))")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	api, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	repl := pool.Config().ConnConfig.Config.Copy()
	repl.RuntimeParams["replication"] = "database"
	repl.RuntimeParams["application_name"] = "baton-relay"
	return &Relay{
		cfg:     cfg,
		pool:    pool,
		nc:      nc,
		log:     *cfg.Logger,
		metrics: m,
		repl:    repl,
		api:     api,
	}, nil
}

// Active reports whether this relay holds the slot and streams from it;
// a relay standing by, or retrying after a failure, is not active.
func (r *Relay) Active() bool { return r.active.Load() }

// Errors that steer the retry loop.
var (
	errSlotActive = errors.New("slot is active in another relay")
	errNATSDown   = errors.New("NATS is not connected")
)

// fatalError is a configuration problem that retrying cannot fix.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Run relays until ctx is cancelled, then stops reading, waits for the
// events in flight, confirms what JetStream acknowledged, and returns nil.
// Failures of PostgreSQL or NATS are retried with backoff; only settings
// that cannot work (a slot of another database or plugin) end Run with an
// error. Run starts the heartbeat and the sweeper and stops them before it
// returns.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run is already running")
	}
	defer r.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Go(func() { r.heartbeatLoop(ctx) })
	wg.Go(func() { r.sweepLoop(ctx) })
	wg.Go(func() { r.streamLoop(ctx) })

	err := r.stream(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// stream runs replication sessions one after the other until ctx ends.
func (r *Relay) stream(ctx context.Context) error {
	backoff := r.cfg.RetryMin
	var standby, waitingForNATS bool
	for {
		streamed, err := r.session(ctx, &standby)
		r.active.Store(false)
		r.metrics.active.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return err
		}
		if streamed {
			backoff = r.cfg.RetryMin
		}
		delay := backoff
		switch {
		case errors.Is(err, errSlotActive):
			if !standby {
				r.log.Info().Str("slot", r.cfg.Slot).Dur("retry_every", r.cfg.StandbyRetry).
					Msg("standby: the slot is held by another relay")
			}
			standby = true
			delay = r.cfg.StandbyRetry
		case errors.Is(err, errNATSDown):
			if !waitingForNATS {
				r.log.Warn().Msg("NATS unavailable; waiting for it, confirming nothing meanwhile")
			}
			waitingForNATS = true
		default:
			r.log.Warn().Err(err).Dur("retry_in", delay).Msg("replication stopped; resuming from the slot")
		}
		if !errors.Is(err, errNATSDown) {
			waitingForNATS = false
		}
		if !standby {
			backoff = min(backoff*2, r.cfg.RetryMax)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}
