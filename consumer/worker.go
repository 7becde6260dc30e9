package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Defaults of a worker.
const (
	DefaultDebounce     = 100 * time.Millisecond
	DefaultMaxAttempts  = 3
	DefaultLease        = 30 * time.Second
	DefaultConcurrency  = 64
	DefaultHistoryLimit = 50
	DefaultBusyDelay    = 250 * time.Millisecond
	DefaultRetryDelay   = 2 * time.Second
	// DefaultShutdownTimeout bounds how long a shutdown lets running turns
	// finish before it gives them up.
	DefaultShutdownTimeout = 10 * time.Second
	// NoDebounce claims as soon as a trigger arrives.
	NoDebounce time.Duration = -1
)

// Config configures a Worker.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// JetStream is the NATS JetStream context. Required.
	JetStream jetstream.JetStream
	// Stream is the outbox stream the relay publishes to. Defaults to
	// nats.StreamConfig's defaults.
	Stream batonnats.StreamConfig
	// Consumer is the durable consumer group shared by every worker with
	// the same name. Its AckWait defaults to Lease: a trigger comes back
	// when the lease of a run that stopped renewing has expired, so the
	// worker that receives it can recover the run inline. Defaults to
	// nats.ConsumerConfig's defaults (name turns, unlimited deliveries).
	Consumer batonnats.ConsumerConfig
	// Agent answers turns. Defaults to Echo.
	Agent Agent
	// Tools are what the agent may call, each journaled in operations.
	// Defaults to the echo agent's lookup and notify.
	Tools Tools
	// Debounce is how long the first trigger of a conversation waits for
	// more, so rapid messages become one turn. NoDebounce claims at once.
	// Defaults to 100ms.
	Debounce time.Duration
	// MaxAttempts caps automatic attempts at a turn; past it a visible
	// error message ends the turn. Defaults to 3.
	MaxAttempts int
	// Lease is how long a claim owns its conversation without renewal. A
	// running turn renews it every third of it, and tells JetStream it is
	// in progress at the same time. A worker that dies holds the
	// conversation for at most this long. Defaults to 30s.
	Lease time.Duration
	// Concurrency is how many turns this worker runs at once. Defaults to
	// 64.
	Concurrency int
	// HistoryLimit is how many earlier messages a turn is given. Defaults
	// to 50.
	HistoryLimit int
	// BusyDelay is the longest a trigger is delayed when another run owns
	// its conversation; it comes back sooner if that run's lease expires
	// sooner. Defaults to 250ms.
	BusyDelay time.Duration
	// RetryDelay is how long a trigger is delayed after an error that may
	// pass, such as the database being unreachable. Defaults to 2s.
	RetryDelay time.Duration
	// RecoveryInterval is how often expired leases are looked for (also at
	// start). Defaults to half the Lease.
	RecoveryInterval time.Duration
	// ShutdownTimeout is how long Run, once its context ends, lets running
	// turns finish before it gives them up (back to pending and announced
	// again, or failed visibly after a started write). Defaults to 10s.
	ShutdownTimeout time.Duration
	// Name identifies this worker in agent_runs. Defaults to
	// <hostname>-<pid>.
	Name string
	// CrashAt arms a crash point for fault tests, in BATON_CRASH_AT's
	// format. Defaults to none.
	CrashAt string
	// Logger receives the worker's logs. Defaults to no logging.
	Logger *zerolog.Logger
	// Registerer receives the worker's metrics. Defaults to a private
	// registry.
	Registerer prometheus.Registerer
	// OnStateChange, when set, is called after each commit that changes a
	// conversation's turn state (claimed, replied, back to pending, failed,
	// cancelled), from the goroutine that committed it. It must not block
	// for long. Defaults to none.
	OnStateChange func(StateChange)
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Consumer.AckWait == 0 && len(c.Consumer.BackOff) == 0 {
		c.Consumer.AckWait = c.Lease
	}
	c.Consumer = c.Consumer.WithDefaults()
	c.Stream = c.Stream.WithDefaults()
	if c.Agent == nil {
		c.Agent = Echo{}
	}
	if c.Tools == nil && c.Pool != nil {
		c.Tools = Tools{}.Register(LookupTool{}, NotifyTool{DB: c.Pool})
	}
	if c.Debounce == 0 {
		c.Debounce = DefaultDebounce
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.HistoryLimit == 0 {
		c.HistoryLimit = DefaultHistoryLimit
	}
	if c.BusyDelay == 0 {
		c.BusyDelay = DefaultBusyDelay
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.RecoveryInterval == 0 {
		c.RecoveryInterval = c.Lease / 2
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns an error naming the first setting that is wrong. It does
// not look at the connections (Pool, JetStream), which New requires.
func (c Config) Validate() error {
	switch {
	case c.Debounce < 0 && c.Debounce != NoDebounce:
		return fmt.Errorf("debounce %s is negative: give 0 for none (--debounce / BATON_DEBOUNCE)", c.Debounce)
	case c.MaxAttempts < 1:
		return fmt.Errorf("max attempts %d must be at least 1 (--max-attempts / BATON_MAX_ATTEMPTS)", c.MaxAttempts)
	case c.Lease < 100*time.Millisecond:
		return fmt.Errorf("lease %s is too short: give at least 100ms, and far more than a database round trip (--lease / BATON_LEASE)", c.Lease)
	case c.Concurrency < 1:
		return fmt.Errorf("concurrency %d must be at least 1 (--concurrency / BATON_CONCURRENCY)", c.Concurrency)
	case c.BusyDelay <= 0 || c.RetryDelay <= 0 || c.RecoveryInterval <= 0 || c.ShutdownTimeout <= 0:
		return errors.New("consumer: BusyDelay, RetryDelay, RecoveryInterval and ShutdownTimeout must be positive")
	case c.Consumer.AckWait <= c.Lease/3:
		// A turn signals progress once per renewal, every third of the
		// lease: an ack wait shorter than that redelivers running turns.
		return fmt.Errorf("ack wait %s must exceed a third of the lease %s, the interval of progress signals (--ack-wait, --lease)", c.Consumer.AckWait, c.Lease)
	}
	if err := c.Stream.Validate(); err != nil {
		return err
	}
	if err := c.Consumer.Validate(); err != nil {
		return err
	}
	_, err := parseCrash(c.CrashAt)
	return err
}

// Worker runs turns for one process of the consumer group.
type Worker struct {
	cfg     Config
	log     zerolog.Logger
	metrics *metrics
	crash   *crasher

	// slots bounds running turns.
	slots chan struct{}

	mu        sync.Mutex
	mailboxes map[string]*mailbox
	// stopping is closed when a graceful shutdown starts: no new claim.
	stopping chan struct{}
	// hardCtx ends the turns still running when the shutdown times out.
	hardCtx context.Context
	wg      sync.WaitGroup
}

// New checks the configuration and returns a worker; Run starts it.
func New(cfg Config) (*Worker, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("consumer: Config.Pool is nil: give a database pool")
	case cfg.JetStream == nil:
		return nil, errors.New("consumer: Config.JetStream is nil: give a JetStream context")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("consumer: register metrics: %w", err)
	}
	crash, _ := parseCrash(cfg.CrashAt)
	return &Worker{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("worker", cfg.Name).Logger(),
		metrics: m,
		crash:   crash,
	}, nil
}

// Run consumes triggers until ctx ends, then shuts down: it stops fetching,
// returns undelivered triggers to the group, lets running turns finish
// within ShutdownTimeout and gives up the rest. It returns nil after a
// shutdown, with no goroutine left behind.
func (w *Worker) Run(ctx context.Context) error {
	cons, err := batonnats.EnsureConsumer(ctx, w.cfg.JetStream, w.cfg.Stream, w.cfg.Consumer)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped while starting: a shutdown, not a failure.
			return nil
		}
		return err
	}
	// Leases left by workers that died while this one was down.
	if err := w.recoverExpired(ctx); err != nil && ctx.Err() == nil {
		w.log.Error().Err(err).Msg("recover expired leases at start")
	}
	sub := &subscription{}
	if err := sub.open(cons, w.pullOptions()...); err != nil {
		return fmt.Errorf("consume %s/%s: %w", w.cfg.Stream.Name, w.cfg.Consumer.Name, err)
	}

	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	w.hardCtx = hardCtx
	w.slots = make(chan struct{}, w.cfg.Concurrency)
	w.mailboxes = map[string]*mailbox{}
	w.stopping = make(chan struct{})

	var loops sync.WaitGroup
	loops.Add(3)
	go func() {
		defer loops.Done()
		<-ctx.Done()
		// Drain hands over what was already fetched; dispatch returns it
		// to the group at once instead of leaving it to the ack wait.
		sub.drain()
	}()
	go func() {
		defer loops.Done()
		w.recoveryLoop(ctx)
	}()
	go func() {
		defer loops.Done()
		w.watchConsumer(ctx, sub)
	}()
	w.log.Info().Str("stream", w.cfg.Stream.Name).Str("consumer", w.cfg.Consumer.Name).Int("concurrency", w.cfg.Concurrency).Msg("worker started")

	for {
		iter := sub.current()
		msg, err := iter.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				// Closed by shutdown, or by the client library when the
				// consumer was deleted: then watchConsumer opens another.
				if ctx.Err() != nil || !sub.await(ctx, iter) {
					break
				}
				continue
			}
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("fetch triggers")
				// A broker that is away answers at once; do not spin.
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
			continue
		}
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		w.dispatch(msg)
	}
	sub.stop()

	w.mu.Lock()
	close(w.stopping)
	w.mu.Unlock()
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(w.cfg.ShutdownTimeout):
		w.log.Warn().Dur("shutdown_timeout", w.cfg.ShutdownTimeout).Msg("turns still running at the shutdown deadline; giving them up")
		hardCancel()
		<-done
	}
	loops.Wait()
	w.log.Info().Msg("worker stopped")
	return nil
}

// stateChanged reports a committed state change.
func (w *Worker) stateChanged(s StateChange) {
	if w.cfg.OnStateChange != nil {
		w.cfg.OnStateChange(s)
	}
}
