// Package group runs consumer groups on the outbox stream: each group is a
// named durable consumer with its own inbox, so every event is applied once
// however often it is delivered or replayed, and its own dead letters, so a
// failing event is parked visibly instead of dropped. Audit and Webhook are
// built-in handlers; Replay moves a group back through the stream's
// retention.
package group

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/consumer/pull"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Handler applies one event for a consumer group. Its effects in Postgres
// go into tx, the transaction that also records the event in the group's
// inbox: they commit together or not at all, so a redelivery or a replay
// never applies an event twice. An effect outside Postgres (an HTTP call)
// is at least once: send Event.ID along so the other side can deduplicate.
//
// An error rolls tx back and the event is delivered again after a backoff;
// past Config.MaxAttempts, or at once for an error wrapped with
// Permanent, the event is parked in group_dead_letters with the error and
// the group moves on.
type Handler func(ctx context.Context, tx pgx.Tx, ev Event) error

// Defaults of a consumer group.
const (
	// DefaultLanes is how many events a group process handles at
	// once.
	DefaultLanes = 8
	// DefaultMaxAttempts caps deliveries of a failing event before it
	// is parked.
	DefaultMaxAttempts = 5
	// DefaultRetryMin is the delay before the second delivery of a
	// failed event; it doubles with each attempt up to DefaultRetryMax.
	DefaultRetryMin = time.Second
	DefaultRetryMax = time.Minute
	// DefaultAckWait is how long an event may go without an ack or a
	// progress signal before JetStream redelivers it. A running handler
	// signals progress every third of it.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxAckPending bounds the events handed out to a group's
	// processes and not yet settled.
	DefaultMaxAckPending = 1000
	// DefaultShutdownTimeout bounds how long a shutdown lets running
	// handlers finish before it cancels them.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultRetryRequestInterval is how often a group looks for dead
	// letters marked for retry.
	DefaultRetryRequestInterval = 5 * time.Second
)

// Config configures a consumer group: a named durable consumer on the
// outbox stream that runs one Handler for every event. The database and
// JetStream come to New.
type Config struct {
	// Name of the group: its durable consumer, and its key in group_inbox
	// and group_dead_letters. Every process that runs a group with this
	// name shares its events. Required.
	Name string
	// Description shown by NATS tools. Defaults to "Baton group <name>".
	Description string
	// Handler applies events. Required.
	Handler Handler
	// Stream is the outbox stream. Defaults to nats.StreamConfig's
	// defaults.
	Stream batonnats.StreamConfig
	// Lanes is how many events this process handles at once. Events of
	// one conversation go to one lane, so they are handled in stream order
	// unless one is retried. Defaults to 8.
	Lanes int
	// MaxAttempts caps deliveries of an event whose handler fails; the
	// last failure parks it. Defaults to 5.
	MaxAttempts int
	// RetryMin is the delay before delivering a failed event again; it
	// doubles with each attempt. Defaults to 1s.
	RetryMin time.Duration
	// RetryMax bounds the delay between attempts. Defaults to 1m.
	RetryMax time.Duration
	// AckWait is how long an event may go unsettled without a progress
	// signal before JetStream hands it to another process. Defaults to
	// 30s.
	AckWait time.Duration
	// MaxAckPending bounds the events handed out to all processes of the
	// group and not yet settled. Defaults to 1000.
	MaxAckPending int
	// ShutdownTimeout is how long Run, once its context ends, lets running
	// handlers finish before it cancels them. Defaults to 10s.
	ShutdownTimeout time.Duration
	// CheckInterval is how often the group checks that its durable still
	// exists, to create it again when it does not. Defaults to 15s.
	CheckInterval time.Duration
	// RetryRequestInterval is how often the group looks for dead letters
	// an operator marked for retry in the console, and retries them with
	// its handler. Defaults to 5s.
	RetryRequestInterval time.Duration
	// Logger receives the group's logs. Defaults to no logging.
	Logger *zerolog.Logger
	// Registerer receives the group's metrics. Defaults to a private
	// registry.
	Registerer prometheus.Registerer
	// OnSettled, when set, is called after each event is settled: acked
	// (applied, duplicate, parked) or handed back (retry). It runs on the
	// lane that handled the event and must not block for long. Defaults
	// to none.
	OnSettled func(Event, Outcome)
	// OnRejoin, when set, is called after the group found its durable gone
	// and created it again. Defaults to none.
	OnRejoin func()
}

// Outcome is how a delivery of an event ended for a group.
type Outcome string

const (
	// OutcomeApplied: the handler's effects and the inbox row committed.
	OutcomeApplied Outcome = "applied"
	// OutcomeDuplicate: the inbox already held the event; nothing ran.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeRetry: the delivery failed and the event comes back later.
	OutcomeRetry Outcome = "retry"
	// OutcomeParked: the event failed for good and sits in
	// group_dead_letters.
	OutcomeParked Outcome = "parked"
)

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	if c.Description == "" {
		c.Description = "Baton group " + c.Name
	}
	if c.Lanes == 0 {
		c.Lanes = DefaultLanes
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryMin)
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = pull.DefaultCheckInterval
	}
	if c.RetryRequestInterval == 0 {
		c.RetryRequestInterval = DefaultRetryRequestInterval
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns a *setting.Error for the first setting that is wrong.
// It does not look at the handler, which New requires.
func (c Config) Validate() error {
	if c.Name == "" {
		return setting.Errorf("Name", `""`, "give the group a name, such as audit")
	}
	for _, r := range c.Name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return setting.Errorf("Name", fmt.Sprintf("%q", c.Name), "holds %q: use letters, digits, '-' and '_'", r)
		}
	}
	switch {
	case c.Lanes < 1:
		return setting.Errorf("Lanes", c.Lanes, "must be at least 1")
	case c.MaxAttempts < 1:
		return setting.Errorf("MaxAttempts", c.MaxAttempts, "must be at least 1")
	case c.RetryMin <= 0:
		return setting.Errorf("RetryMin", c.RetryMin, "must be positive")
	case c.RetryMax < c.RetryMin:
		return setting.Errorf("RetryMax", c.RetryMax, "is below the retry min %s", c.RetryMin)
	case c.ShutdownTimeout <= 0:
		return setting.Errorf("ShutdownTimeout", c.ShutdownTimeout, "must be positive")
	case c.CheckInterval <= 0:
		return setting.Errorf("CheckInterval", c.CheckInterval, "must be positive")
	case c.RetryRequestInterval <= 0:
		return setting.Errorf("RetryRequestInterval", c.RetryRequestInterval, "must be positive")
	}
	if err := c.Stream.Validate(); err != nil {
		return setting.Within("Stream", err)
	}
	// The durable's settings are the group's own fields (AckWait,
	// MaxAckPending), with the same names.
	return c.consumer().Validate()
}

// consumer is the group's durable consumer. MaxDeliver is unlimited and
// there is no broker backoff: attempts are counted here and end in a
// visible dead letter, where a broker cap would drop the event silently.
func (c Config) consumer() batonnats.ConsumerConfig {
	return batonnats.ConsumerConfig{
		Name:          c.Name,
		Description:   c.Description,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}.WithDefaults()
}

// Group runs a Handler as a named durable consumer group on the outbox
// stream.
//
// The turn runner (consumer.Worker) is the group named turns: it runs the
// same pull loop (consumer/pull: one durable per group, deliver policy all),
// and Replay drives it like any group. It keeps its own deduplication
// instead of an inbox, because its effect is not per event: a trigger means
// "look at this conversation's pending rows", the claim takes only pending
// rows, and the reply ID derives from the claimed rows. A redelivered or
// replayed trigger therefore finds nothing to claim and is acked.
type Group struct {
	cfg     Config
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	log     zerolog.Logger
	metrics *metrics
}

// New checks the configuration and returns a group over pool and js, both
// owned by the caller; Run starts it. Run needs js; a group that only
// retries dead letters (RetryDeadLetter) may be given nil.
func New(cfg Config, pool *pgxpool.Pool, js jetstream.JetStream) (*Group, error) {
	switch {
	case pool == nil:
		return nil, errors.New("group: the pool is nil: give New a database pool")
	case cfg.Handler == nil:
		return nil, errors.New("group: Config.Handler is nil: give the function that applies events")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("group: register metrics of group %s: %w", cfg.Name, err)
	}
	return &Group{cfg: cfg, pool: pool, js: js, log: cfg.Logger.With().Str("group", cfg.Name).Logger(), metrics: m}, nil
}

// Name returns the group's name.
func (g *Group) Name() string { return g.cfg.Name }

// Durable returns the group's durable consumer settings on the stream, the
// same provisioning the turn runner uses.
func (g *Group) Durable() (batonnats.StreamConfig, batonnats.ConsumerConfig) {
	return g.cfg.Stream, g.cfg.consumer()
}

// Run handles events until ctx ends, then shuts down: it stops fetching,
// hands undelivered events back to the group, lets running handlers finish
// within ShutdownTimeout and cancels the rest. A durable that disappears
// (deleted, or lost with a stream recreated empty) is created again and the
// group goes on. Run returns nil after a shutdown, with no goroutine left
// behind.
func (g *Group) Run(ctx context.Context) error {
	if g.js == nil {
		return errors.New("group: the JetStream context is nil: give New one (jetstream.New of a NATS connection) to run the group")
	}
	stream, durable := g.Durable()
	loop, err := pull.New(pull.Config{
		Stream:        stream,
		Consumer:      durable,
		MaxMessages:   max(2*g.cfg.Lanes, 16),
		CheckInterval: g.cfg.CheckInterval,
		Logger:        &g.log,
		OnRejoin:      g.cfg.OnRejoin,
	}, g.js)
	if err != nil {
		return err
	}
	// Handlers run on hardCtx: a shutdown lets them finish (their
	// transaction commits or rolls back whole) until ShutdownTimeout.
	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()

	var wg sync.WaitGroup
	lanes := make([]chan jetstream.Msg, g.cfg.Lanes)
	for i := range lanes {
		lanes[i] = make(chan jetstream.Msg, 2)
		in := lanes[i]
		wg.Go(func() {
			for msg := range in {
				if ctx.Err() != nil {
					// Not started: back to the group at once.
					_ = msg.Nak()
					continue
				}
				g.handle(hardCtx, msg)
			}
		})
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	wg.Go(func() { g.watchDeadLetters(watchCtx) })
	wg.Go(func() { g.applyRetryRequests(watchCtx) })
	defer stopWatch()
	g.log.Info().Str("stream", stream.Name).Int("lanes", g.cfg.Lanes).Msg("group started")
	runErr := loop.Run(ctx, func(msg jetstream.Msg) {
		lanes[laneOf(msg.Subject(), len(lanes))] <- msg
	})
	for _, l := range lanes {
		close(l)
	}
	stopWatch()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(g.cfg.ShutdownTimeout):
		g.log.Warn().Dur("shutdown_timeout", g.cfg.ShutdownTimeout).Msg("handlers still running at the shutdown deadline; cancelling them")
		hardCancel()
		<-done
	}
	if runErr != nil {
		return runErr
	}
	g.log.Info().Msg("group stopped")
	return nil
}

// laneOf keeps the events of one subject (one conversation) on one lane.
func laneOf(subject string, lanes int) int {
	return int(batonnats.Hash(subject) % uint32(lanes))
}

// handle applies one delivered event and settles it.
func (g *Group) handle(ctx context.Context, msg jetstream.Msg) {
	ev, err := eventOf(g.cfg.Name, msg)
	if err != nil {
		// Redelivering a body that does not parse would never help.
		g.settle(ctx, msg, ev, &handlerError{err: Permanent(fmt.Errorf("malformed event: %w", err))})
		return
	}
	// The event continues the trace of the request that wrote its row.
	ctx, span := telemetry.Tracer().Start(telemetry.FromTraceParent(ctx, msg.Headers().Get(batonnats.HeaderTraceParent)), "group "+g.cfg.Name,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("baton.group", g.cfg.Name), attribute.String("baton.event_id", ev.ID)))
	defer span.End()
	stop := keepAlive(msg, g.cfg.AckWait/3)
	outcome, err := g.apply(ctx, ev)
	stop()
	span.SetAttributes(attribute.String("baton.outcome", string(outcome)))
	if err != nil {
		g.settle(ctx, msg, ev, err)
		return
	}
	_ = msg.Ack()
	g.settled(ev, outcome)
}

// settle ends a delivery that failed: a handler error is retried with
// backoff, and parked past the cap; anything else (the database away, a
// shutdown) is retried without counting against the handler.
func (g *Group) settle(ctx context.Context, msg jetstream.Msg, ev Event, err error) {
	log := g.log.With().Str("event_id", ev.ID).Uint64("stream_seq", ev.StreamSeq).Int("attempt", ev.Attempt).Logger()
	if ctx.Err() != nil {
		// Cut short by the shutdown deadline: not the event's fault.
		_ = msg.Nak()
		g.settled(ev, OutcomeRetry)
		return
	}
	var he *handlerError
	if !errors.As(err, &he) {
		log.Error().Err(err).Msg("apply event")
		_ = msg.NakWithDelay(g.retryDelay(ev.Attempt))
		g.settled(ev, OutcomeRetry)
		return
	}
	if !IsPermanent(he.err) && ev.Attempt < g.cfg.MaxAttempts {
		delay := g.retryDelay(ev.Attempt)
		log.Warn().Err(he.err).Dur("retry_in", delay).Msg("handler failed; event will be delivered again")
		_ = msg.NakWithDelay(delay)
		g.settled(ev, OutcomeRetry)
		return
	}
	if perr := g.park(ctx, ev, he.err); perr != nil {
		// Not parked: the event must not be lost, so it comes back.
		if ctx.Err() == nil {
			log.Error().Err(perr).AnErr("handler_error", he.err).Msg("park event")
		}
		_ = msg.NakWithDelay(g.retryDelay(ev.Attempt))
		g.settled(ev, OutcomeRetry)
		return
	}
	_ = msg.Ack()
	log.Error().Err(he.err).Msg("event parked in group_dead_letters")
	g.settled(ev, OutcomeParked)
}

func (g *Group) settled(ev Event, o Outcome) {
	g.metrics.events.WithLabelValues(string(o)).Inc()
	if g.cfg.OnSettled != nil {
		g.cfg.OnSettled(ev, o)
	}
}

// retryDelay is the backoff after the given attempt failed.
func (g *Group) retryDelay(attempt int) time.Duration {
	d := g.cfg.RetryMin
	for i := 1; i < attempt && d < g.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, g.cfg.RetryMax)
}

// keepAlive tells JetStream every interval that msg is being worked on,
// until the returned function is called. No call to InProgress happens
// after it returns.
func keepAlive(msg jetstream.Msg, every time.Duration) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = msg.InProgress()
		t.Reset(every)
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// metrics of a group, labelled with its name.
type metrics struct {
	events      *prometheus.CounterVec
	deadLetters prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, group string) (*metrics, error) {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "baton_group_events_total",
			Help:        "Event deliveries settled by a consumer group, by outcome (applied, duplicate, retry, parked).",
			ConstLabels: prometheus.Labels{"group": group},
		}, []string{"outcome"}),
		deadLetters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "baton_group_dead_letters",
			Help:        "Events the group parked in group_dead_letters and nobody resolved yet (applied by a replay or a retry, or discarded); read at each check interval.",
			ConstLabels: prometheus.Labels{"group": group},
		}),
	}
	// Every outcome is a series from the start, so that a rate over it
	// exists before the first event of that outcome.
	for _, o := range []Outcome{OutcomeApplied, OutcomeDuplicate, OutcomeRetry, OutcomeParked} {
		m.events.WithLabelValues(string(o))
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{m.events, m.deadLetters} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// watchDeadLetters refreshes the dead letters gauge every interval until
// ctx ends.
func (g *Group) watchDeadLetters(ctx context.Context) {
	t := time.NewTicker(g.cfg.CheckInterval)
	defer t.Stop()
	for {
		g.refreshDeadLetters(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshDeadLetters reads the group's unresolved dead letters into its
// gauge; a failure leaves the last value (the database may be away).
func (g *Group) refreshDeadLetters(ctx context.Context) {
	n, err := schema.CountDeadLetters(ctx, g.pool, g.cfg.Name)
	if err == nil {
		g.metrics.deadLetters.Set(float64(n))
	}
}
