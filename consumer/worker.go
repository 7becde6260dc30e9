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

	"github.com/batonhq/baton/consumer/pull"
	"github.com/batonhq/baton/internal/setting"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Defaults of a worker.
const (
	DefaultDebounce     = 100 * time.Millisecond
	DefaultMaxAttempts  = 3
	DefaultLease        = 30 * time.Second
	DefaultConcurrency  = 64
	DefaultHistoryLimit = 50
	// DefaultMaxTurnMessages caps the user messages one turn answers.
	DefaultMaxTurnMessages = 20
	// DefaultTurnTimeout is a turn's wall-clock deadline.
	DefaultTurnTimeout = 15 * time.Minute
	DefaultBusyDelay   = 250 * time.Millisecond
	// DefaultLockWait bounds a claim's wait for a conversation another
	// transaction holds (at most a third of the lease).
	DefaultLockWait   = 5 * time.Second
	DefaultRetryDelay = 2 * time.Second
	// DefaultShutdownTimeout bounds how long a shutdown lets running turns
	// finish before it gives them up.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultApprovalTTL is how long a call waits for its approval.
	DefaultApprovalTTL = 24 * time.Hour
	// NoDebounce commits every reply as soon as it is ready: rapid
	// messages may get a reply each.
	NoDebounce time.Duration = -1
	// DefaultSessionCheckInterval is how often a worker looks for runs
	// whose worker's session ended.
	DefaultSessionCheckInterval = 500 * time.Millisecond
	// NoSession turns the worker's session off (Config.SessionCheckInterval):
	// its runs record none and are left to their leases.
	NoSession time.Duration = -1
)

// Config configures a Worker. It holds settings only: the database and
// JetStream come to New.
type Config struct {
	// Stream is the outbox stream the relay publishes to. Defaults to
	// nats.StreamConfig's defaults.
	Stream batonnats.StreamConfig
	// Consumer is the durable consumer group shared by every worker with
	// the same name. Its AckWait defaults to Lease: a trigger comes back
	// when the lease of a run that stopped renewing has expired, so the
	// worker that receives it can recover the run inline. Defaults to
	// nats.ConsumerConfig's defaults (name turns, unlimited deliveries).
	Consumer batonnats.ConsumerConfig
	// Agent answers the steps of turns. Defaults to Echo.
	Agent Agent
	// Tools are what the agent may call, each journaled in operations;
	// those that declare themselves (DeclaredTool) are offered to it in
	// each step. Defaults to the echo agent's lookup and notify.
	Tools Tools
	// MaxToolIterations caps the steps of a turn that ask for tools: an
	// agent still asking for tools after them ends the turn with a
	// visible error (ErrToolIterations). Defaults to 8.
	MaxToolIterations int
	// ToolSource, when set, lists the tools of each turn when it starts
	// (MCP servers'): the turn's tools are those, fixed for the turn, and
	// the agent finds them in Turn.Tools. Defaults to none: every turn
	// has Tools.
	ToolSource ToolSource
	// ApprovalTTL is how long a call may wait for a person's approval
	// (see ApprovalTool); past it the call is denied. Defaults to 24
	// hours.
	ApprovalTTL time.Duration
	// Debounce is the quiet window of a burst. A turn is claimed and its
	// model call started as soon as a message arrives; its reply commits
	// only once Debounce has passed since the conversation's newest
	// message, and a newer message that arrives before then supersedes
	// the turn (unless it started a write): the next turn answers all of
	// them, so a burst gets one reply. A model call that takes longer than
	// the window adds no wait. NoDebounce turns superseding off. Defaults
	// to 100ms.
	//
	// It applies to conversations whose double texting is debounce (the
	// default, schema.DoubleTextingDebounce); the other policies decide
	// what a newer message does themselves, and their replies wait for no
	// window.
	Debounce time.Duration
	// MaxAttempts caps automatic attempts at a turn; past it a visible
	// error message ends the turn. Defaults to 3.
	MaxAttempts int
	// Lease is how long a claim owns its conversation without renewal. A
	// running turn renews it every third of it, and tells JetStream it is
	// in progress at the same time. A worker that dies holds the
	// conversation for at most this long. Defaults to 30s.
	Lease time.Duration
	// Concurrency is how many turns this worker runs at once, and the
	// most claims or finalizes one statement carries: the worker sends
	// one claim statement and one finalize statement at a time, each with
	// every call that waited for the one before. Defaults to 64.
	Concurrency int
	// HistoryLimit is how many earlier messages a turn is given. Defaults
	// to 50.
	HistoryLimit int
	// MaxTurnMessages caps the pending messages one turn claims, oldest
	// first; the rest are the next turns', in order. It bounds what one
	// turn carries into a prompt. Defaults to 20.
	MaxTurnMessages int
	// TurnTimeout is a turn's wall-clock deadline, from its claim: past
	// it the attempt fails like any failed attempt (retried under
	// MaxAttempts, then a visible error). Defaults to 15 minutes.
	TurnTimeout time.Duration
	// BusyDelay is the longest a trigger is delayed when another run owns
	// its conversation; it comes back sooner if that run's lease expires
	// sooner. Defaults to 250ms.
	BusyDelay time.Duration
	// LockWait is how long a turn's claim waits for its conversation while
	// another transaction holds the row (an operator's open transaction,
	// a long delete); the triggers then come back after BusyDelay. It
	// waits on its own connection, outside the shared claim statement, and
	// at most a quarter of the pool's connections wait so at once: the
	// other turns' statements and lease renewals keep theirs. Must be
	// shorter than the Lease. Defaults to 5s or a third of the Lease,
	// whichever is shorter.
	LockWait time.Duration
	// RetryDelay is how long a trigger is delayed after an error that may
	// pass, such as the database being unreachable. Defaults to 2s.
	RetryDelay time.Duration
	// RecoveryInterval is how often expired leases are looked for (also at
	// start). Defaults to half the Lease.
	RecoveryInterval time.Duration
	// SessionCheckInterval is how often this worker looks for runs of
	// gone workers and recovers them. Each worker holds a database session
	// of its own, a lock on a connection outside the pool (see
	// schema.TakeWorkerSession), for as long as it lives, and records it on
	// the runs it claims: a worker that dies releases it at once, so its
	// conversations are announced again within this interval, and a claim
	// of one of them takes it over at once, instead of after the lease. A
	// worker claims and finalizes only while it holds its session. The
	// connection needs a direct session with the server: NoSession turns
	// it off behind a pooler that hands a client's statements to any
	// server session (PgBouncer's transaction mode), and leaves runs to
	// their leases. Defaults to 500ms.
	SessionCheckInterval time.Duration
	// ShutdownTimeout is how long Run, once its context ends, lets running
	// turns finish before it gives them up (back to pending and announced
	// again, or failed visibly after a started write). Defaults to 10s.
	ShutdownTimeout time.Duration
	// Name identifies this worker in agent_runs. Defaults to
	// <hostname>-<pid>.
	Name string
	// Logger receives the worker's logs. Defaults to no logging.
	Logger *zerolog.Logger
	// Registerer receives the worker's metrics. Defaults to a private
	// registry.
	Registerer prometheus.Registerer
	// OnConversationEvent, when set, is called after each commit that
	// changes a conversation's turn (processing, replied, pending again,
	// failed, cancelled), from the goroutine that committed it: a change
	// is reported only once it committed, so whoever publishes it never
	// announces what did not happen. It must not block for long. Defaults
	// to none.
	OnConversationEvent func(batonnats.ConversationEvent)
	// OnRejoin, when set, is called after the worker found its durable
	// consumer gone and created it again. Defaults to none.
	OnRejoin func()
	// Live receives the replies of turns while agents write them, and the
	// tool calls of their journals, on each run's live subject (a
	// *nats.Conn fits); the worker answers snapshot requests and stop
	// notices on the connection of JetStream. Defaults to the connection
	// of JetStream.
	Live Publisher
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
	if c.Debounce == 0 {
		c.Debounce = DefaultDebounce
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxToolIterations == 0 {
		c.MaxToolIterations = DefaultMaxToolIterations
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.HistoryLimit == 0 {
		c.HistoryLimit = DefaultHistoryLimit
	}
	if c.MaxTurnMessages == 0 {
		c.MaxTurnMessages = DefaultMaxTurnMessages
	}
	if c.TurnTimeout == 0 {
		c.TurnTimeout = DefaultTurnTimeout
	}
	if c.BusyDelay == 0 {
		c.BusyDelay = DefaultBusyDelay
	}
	if c.LockWait == 0 {
		c.LockWait = min(DefaultLockWait, c.Lease/3)
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
	if c.SessionCheckInterval == 0 {
		c.SessionCheckInterval = DefaultSessionCheckInterval
	}
	if c.ApprovalTTL == 0 {
		c.ApprovalTTL = DefaultApprovalTTL
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

// Validate returns a *setting.Error for the first setting that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Debounce < 0 && c.Debounce != NoDebounce:
		return setting.Errorf("Debounce", c.Debounce, "negative: give NoDebounce to claim at once")
	case c.MaxAttempts < 1:
		return setting.Errorf("MaxAttempts", c.MaxAttempts, "must be at least 1")
	case c.MaxToolIterations < 1:
		return setting.Errorf("MaxToolIterations", c.MaxToolIterations, "must be at least 1")
	case c.Lease < 100*time.Millisecond:
		return setting.Errorf("Lease", c.Lease, "too short: give at least 100ms, and far more than a database round trip")
	case c.Concurrency < 1:
		return setting.Errorf("Concurrency", c.Concurrency, "must be at least 1")
	case c.MaxTurnMessages < 1:
		return setting.Errorf("MaxTurnMessages", c.MaxTurnMessages, "must be at least 1")
	case c.TurnTimeout <= 0:
		return setting.Errorf("TurnTimeout", c.TurnTimeout, "must be positive")
	case c.BusyDelay <= 0:
		return setting.Errorf("BusyDelay", c.BusyDelay, "must be positive")
	case c.LockWait <= 0 || c.LockWait >= c.Lease:
		return setting.Errorf("LockWait", c.LockWait, "must be positive and shorter than the lease %s", c.Lease)
	case c.RetryDelay <= 0:
		return setting.Errorf("RetryDelay", c.RetryDelay, "must be positive")
	case c.RecoveryInterval <= 0:
		return setting.Errorf("RecoveryInterval", c.RecoveryInterval, "must be positive")
	case c.ShutdownTimeout <= 0:
		return setting.Errorf("ShutdownTimeout", c.ShutdownTimeout, "must be positive")
	case c.SessionCheckInterval <= 0 && c.SessionCheckInterval != NoSession:
		return setting.Errorf("SessionCheckInterval", c.SessionCheckInterval, "must be positive, or NoSession to leave runs to their leases")
	case c.ApprovalTTL < time.Second:
		return setting.Errorf("ApprovalTTL", c.ApprovalTTL, "give at least 1s: a person needs time to decide")
	case c.Consumer.AckWait <= c.Lease/3:
		// A turn signals progress once per renewal, every third of the
		// lease: an ack wait shorter than that redelivers running turns.
		return setting.Errorf("Consumer.AckWait", c.Consumer.AckWait, "must exceed a third of the lease %s, the interval of progress signals", c.Lease)
	}
	if err := c.Stream.Validate(); err != nil {
		return setting.Within("Stream", err)
	}
	if err := c.Consumer.Validate(); err != nil {
		return setting.Within("Consumer", err)
	}
	return nil
}

// Worker runs turns for one process of the consumer group.
type Worker struct {
	cfg     Config
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	log     zerolog.Logger
	metrics *metrics
	crash   *crasher
	// session is the worker's database session; nil with NoSession.
	session *session

	// slots bounds running turns.
	slots chan struct{}
	// alone bounds the claims that wait for a conversation on their own
	// connection (see Config.LockWait).
	alone chan struct{}
	// claims and finalizes run the claims and finalizes of turns ready at
	// the same time in one statement each.
	claims    *batcher[schema.ClaimParams, schema.ClaimResult]
	finalizes *batcher[schema.Finalize, schema.FinalizeResult]

	// runs are the turns running on this worker, by the run's subject
	// token, for stop notices and snapshot requests.
	runsMu sync.Mutex
	runs   map[string]*runningTurn

	mu        sync.Mutex
	mailboxes map[string]*mailbox
	// stopping is closed when a graceful shutdown starts: no new claim.
	stopping chan struct{}
	// hardCtx ends the turns still running when the shutdown times out.
	hardCtx context.Context
	wg      sync.WaitGroup
}

// New checks the configuration and returns a worker over pool and js, both
// owned by the caller; Run starts it. It arms the crash or pause point that
// CrashEnv or PauseEnv names, if any.
func New(cfg Config, pool *pgxpool.Pool, js jetstream.JetStream) (*Worker, error) {
	switch {
	case pool == nil:
		return nil, errors.New("consumer: the pool is nil: give New a database pool")
	case js == nil:
		return nil, errors.New("consumer: the JetStream context is nil: give New one (jetstream.New of a NATS connection)")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	crash, err := armFromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if cfg.Live == nil {
		cfg.Live = js.Conn()
	}
	if cfg.Tools == nil {
		cfg.Tools = Tools{}.Register(LookupTool{}, NotifyTool{DB: pool})
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("consumer: register metrics: %w", err)
	}
	crash.listen()
	w := &Worker{
		cfg:     cfg,
		pool:    pool,
		js:      js,
		log:     cfg.Logger.With().Str("worker", cfg.Name).Logger(),
		metrics: m,
		crash:   crash,
	}
	if cfg.SessionCheckInterval != NoSession {
		w.session = newSession(pool, w.log, m.sessionHeld)
		w.session.lost = w.handBackWaiting
	}
	return w, nil
}

// Run consumes triggers until ctx ends, then shuts down: it stops fetching,
// returns undelivered triggers to the group, lets running turns finish
// within ShutdownTimeout and gives up the rest. It returns nil after a
// shutdown, with no goroutine left behind.
func (w *Worker) Run(ctx context.Context) error {
	loop, err := pull.New(pull.Config{
		Stream:        w.cfg.Stream,
		Consumer:      w.cfg.Consumer,
		MaxMessages:   max(2*w.cfg.Concurrency, pull.DefaultMaxMessages),
		CheckInterval: w.cfg.RecoveryInterval,
		Logger:        &w.log,
		OnRejoin:      w.cfg.OnRejoin,
	}, w.js)
	if err != nil {
		return err
	}
	// The session outlives the turns: it is released once every turn is
	// over, so that nothing this worker still runs looks gone meanwhile.
	var sessionDone sync.WaitGroup
	sessionCtx, stopSession := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopSession()
		sessionDone.Wait()
	}()
	if w.session != nil {
		sessionDone.Go(func() { w.session.run(sessionCtx) })
	}
	// Leases left by workers that died while this one was down.
	if err := w.recoverExpired(ctx); err != nil && ctx.Err() == nil {
		w.log.Error().Err(err).Msg("recover expired leases at start")
	}

	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	w.hardCtx = hardCtx
	w.slots = make(chan struct{}, w.cfg.Concurrency)
	w.alone = make(chan struct{}, max(1, int(w.pool.Config().MaxConns)/4))
	w.mailboxes = map[string]*mailbox{}
	w.stopping = make(chan struct{})
	claimTurns, finalizeTurns := w.metrics.statementTurns.WithLabelValues("claim"), w.metrics.statementTurns.WithLabelValues("finalize")
	// Under mu only for tests, which look at the queue of claims.
	w.mu.Lock()
	w.claims = startBatcher(w.cfg.Concurrency, func(ps []schema.ClaimParams) []schema.ClaimResult {
		claimTurns.Observe(float64(len(ps)))
		return schema.ClaimTurnsNoWait(hardCtx, w.pool, ps, w.cfg.HistoryLimit)
	})
	w.finalizes = startBatcher(w.cfg.Concurrency, func(fs []schema.Finalize) []schema.FinalizeResult {
		// A finalize runs even when the turn's context has ended: an
		// answer that exists is worth committing.
		finalizeTurns.Observe(float64(len(fs)))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(hardCtx), commitTimeout)
		defer cancel()
		return schema.FinalizeTurnsNoWait(ctx, w.pool, fs)
	})
	w.mu.Unlock()

	w.runs = map[string]*runningTurn{}
	unlisten := w.listen()
	defer unlisten()

	var loops sync.WaitGroup
	loops.Go(func() { w.recoveryLoop(ctx) })
	if w.session != nil {
		loops.Go(func() { w.orphanLoop(ctx) })
	}
	w.log.Info().Str("stream", w.cfg.Stream.Name).Str("consumer", w.cfg.Consumer.Name).Int("concurrency", w.cfg.Concurrency).Msg("worker started")
	runErr := loop.Run(ctx, w.dispatch)

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
	// Every turn is over: no claim or finalize comes any more.
	w.claims.close()
	w.finalizes.close()
	loops.Wait()
	if runErr != nil {
		return runErr
	}
	w.log.Info().Msg("worker stopped")
	return nil
}

// emit reports a committed change of a conversation's turn.
func (w *Worker) emit(ev batonnats.ConversationEvent) {
	if w.cfg.OnConversationEvent != nil {
		w.cfg.OnConversationEvent(ev)
	}
}
