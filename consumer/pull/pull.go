// Package pull is the fetch loop of a durable JetStream pull consumer, the
// one loop that the turn runner and every consumer group run: it provisions
// the durable, hands each fetched message to its owner, rejoins a durable
// that disappeared (deleted, or lost with a stream recreated empty), and on
// shutdown hands what it fetched back to the group at once instead of
// leaving it to the ack wait.
package pull

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Defaults of a Loop.
const (
	// DefaultMaxMessages is how many messages one pull asks for.
	DefaultMaxMessages = 64
	// DefaultCheckInterval is how often the loop checks that its durable
	// still exists.
	DefaultCheckInterval = 15 * time.Second
	// DefaultRetryDelay is the pause after a failed fetch: a broker that
	// is away answers at once, and the loop must not spin.
	DefaultRetryDelay = 100 * time.Millisecond
	// DefaultHeartbeat is how often the server confirms a waiting pull.
	DefaultHeartbeat = 2 * time.Second
)

// checkTimeout bounds one look at the durable.
const checkTimeout = 5 * time.Second

// Config configures a Loop. It holds settings only: the JetStream context
// comes to New.
type Config struct {
	// Stream is the stream the durable consumes. Defaults to
	// nats.StreamConfig's defaults.
	Stream batonnats.StreamConfig
	// Consumer is the durable consumer: created or updated at start, and
	// created again whenever the loop finds it gone. Defaults to
	// nats.ConsumerConfig's defaults.
	Consumer batonnats.ConsumerConfig
	// MaxMessages is how many messages one pull asks for, which bounds
	// what this process holds before it hands messages out. Defaults to
	// 64.
	MaxMessages int
	// CheckInterval is how often the loop checks that the durable still
	// exists. A stream lost with all its data comes back empty, recreated
	// by the relay, without the durable: the client then waits forever on
	// a consumer that no longer exists. The loop also checks at once when
	// its subscription ends by itself. Defaults to 15s.
	CheckInterval time.Duration
	// RetryDelay is the pause after a failed fetch. Defaults to 100ms.
	RetryDelay time.Duration
	// Heartbeat is how often the server confirms a waiting pull request.
	// A pull that the server could not take (sent after a reconnect while
	// the durable was gone, before another member of the group created it
	// again) is answered with a status the client library does not act
	// on: it waits for the messages it asked for until two heartbeats are
	// missing, then asks again. The library's default is half the pull's
	// 30 s expiry, which left a worker idle for up to 30 s after a stream
	// was lost. Defaults to 2s; from 500ms (the client library's least) to 15s.
	Heartbeat time.Duration
	// Logger receives the loop's logs. Defaults to no logging.
	Logger *zerolog.Logger
	// OnRejoin, when set, is called after the loop created its durable
	// again and subscribed to it. Defaults to none.
	OnRejoin func()
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	c.Consumer = c.Consumer.WithDefaults()
	if c.MaxMessages == 0 {
		c.MaxMessages = DefaultMaxMessages
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Loop fetches the messages of one durable consumer.
type Loop struct {
	cfg Config
	js  jetstream.JetStream
	log zerolog.Logger
}

// New returns a loop over js, owned by the caller; Run starts it.
func New(cfg Config, js jetstream.JetStream) (*Loop, error) {
	if js == nil {
		return nil, errors.New("pull: the JetStream context is nil: give New one (jetstream.New of a NATS connection)")
	}
	cfg = cfg.WithDefaults()
	switch {
	case cfg.MaxMessages < 1:
		return nil, fmt.Errorf("pull: Config.MaxMessages %d must be at least 1", cfg.MaxMessages)
	case cfg.CheckInterval <= 0 || cfg.RetryDelay <= 0:
		return nil, errors.New("pull: Config.CheckInterval and Config.RetryDelay must be positive")
	case cfg.Heartbeat < 500*time.Millisecond || cfg.Heartbeat > jetstream.DefaultExpires/2:
		return nil, fmt.Errorf("pull: Config.Heartbeat %s must be from 500ms to %s", cfg.Heartbeat, jetstream.DefaultExpires/2)
	}
	log := cfg.Logger.With().Str("stream", cfg.Stream.Name).Str("consumer", cfg.Consumer.Name).Logger()
	return &Loop{cfg: cfg, js: js, log: log}, nil
}

// Run provisions the durable and calls deliver with every fetched message,
// one after the other on the calling goroutine, until ctx ends. deliver
// owns the message: it acks, naks or terminates it. After ctx ends no
// message reaches deliver; those already fetched are handed back to the
// group at once. Run returns nil after ctx ended; an error when it could
// not start, or when the NATS connection was closed for good (nothing can
// arrive any more); and no goroutine is left behind.
func (l *Loop) Run(ctx context.Context, deliver func(jetstream.Msg)) error {
	sub, err := l.start(ctx)
	if err != nil {
		return err
	}
	if sub == nil {
		// Stopped while starting: a shutdown, not a failure.
		return nil
	}
	runCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// check asks the watcher to look at once, when the subscription ended
	// by itself.
	check := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		// Drain hands over what was already fetched; the loop below
		// returns it to the group.
		sub.drain()
	})
	wg.Go(func() { l.watch(ctx, sub, check) })

	var stopErr error
	failing := false
	for {
		iter := sub.current()
		msg, err := iter.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				// Closed by the shutdown, or by the client library when the
				// durable was deleted: the watcher then opens another.
				if ctx.Err() != nil {
					break
				}
				if stopErr = l.closed(); stopErr != nil {
					break
				}
				sub.end(iter)
				select {
				case check <- struct{}{}:
				default:
				}
				if !sub.await(ctx, iter) {
					break
				}
				continue
			}
			if stopErr = l.closed(); stopErr != nil {
				break
			}
			if ctx.Err() == nil {
				if !failing {
					l.log.Warn().Err(err).Msg("fetch failed; retrying until it works again")
					failing = true
				}
				select {
				case <-ctx.Done():
				case <-time.After(l.cfg.RetryDelay):
				}
			}
			continue
		}
		if failing {
			l.log.Info().Msg("fetching again")
			failing = false
		}
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		deliver(msg)
	}
	sub.stop()
	cancel()
	wg.Wait()
	if runCtx.Err() != nil {
		return nil
	}
	return stopErr
}

// start provisions the durable and subscribes to it, trying again, after
// RetryDelay doubling up to five seconds, for as long as it fails: a
// process that starts while NATS or the stream is away waits for them,
// as it does when they go later, instead of exiting. It logs each cause
// once, returns nil when ctx ends first, and an error only when the NATS
// connection is closed for good.
func (l *Loop) start(ctx context.Context) (*subscription, error) {
	var logged string
	for delay := l.cfg.RetryDelay; ; delay = min(2*delay, 5*time.Second) {
		cons, err := l.provision(ctx)
		if err == nil {
			sub := &subscription{}
			if err = sub.open(cons, l.options()...); err == nil {
				if logged != "" {
					l.log.Info().Msg("durable consumer ready")
				}
				return sub, nil
			}
			err = fmt.Errorf("consume %s/%s: %w", l.cfg.Stream.Name, l.cfg.Consumer.Name, err)
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if cerr := l.closed(); cerr != nil {
			return nil, cerr
		}
		if err.Error() != logged {
			logged = err.Error()
			l.log.Warn().Err(err).Dur("retry_in", delay).Msg("durable consumer cannot be set up yet; trying again")
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(delay):
		}
	}
}

// closed returns an error when the NATS connection is closed for good:
// nothing can arrive any more.
func (l *Loop) closed() error {
	if nc := l.js.Conn(); nc != nil && nc.IsClosed() {
		return fmt.Errorf("%s/%s stopped receiving events: the NATS connection is closed for good; start the process again", l.cfg.Stream.Name, l.cfg.Consumer.Name)
	}
	return nil
}

func (l *Loop) provision(ctx context.Context) (jetstream.Consumer, error) {
	return batonnats.EnsureConsumer(ctx, l.js, l.cfg.Stream, l.cfg.Consumer)
}

func (l *Loop) options() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(l.cfg.MaxMessages), jetstream.PullHeartbeat(l.cfg.Heartbeat)}
}

// watch checks every CheckInterval, and whenever asked, that the durable
// still exists, and creates it again with a new subscription when it does
// not. When the subscription ended by itself (the client library closes it
// when the durable is deleted) it subscribes again even if the durable
// exists: another member of the group may have created it again first.
// Until it has, it looks again after RetryDelay, doubling up to a second,
// instead of after CheckInterval: the loop fetches nothing meanwhile. Each
// rejoin is logged once, and so is a durable that cannot be created yet
// (its stream not back).
func (l *Loop) watch(ctx context.Context, sub *subscription, check <-chan struct{}) {
	t := time.NewTicker(l.cfg.CheckInterval)
	defer t.Stop()
	failing := false
	var (
		soon  <-chan time.Time
		delay time.Duration
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-check:
		case <-soon:
		}
		soon = nil
		step, err := l.rejoin(ctx, sub)
		if ctx.Err() != nil {
			return
		}
		next := l.cfg.CheckInterval
		if sub.ended() {
			delay = min(max(2*delay, l.cfg.RetryDelay), time.Second)
			soon = time.After(delay)
			next = time.Second
		}
		switch {
		case step == nil:
		case err == nil:
			failing, delay = false, 0
			l.log.Warn().Msg(step.done)
			if l.cfg.OnRejoin != nil {
				l.cfg.OnRejoin()
			}
		case !failing:
			failing = true
			l.log.Warn().Err(err).Dur("retry_within", next).Msg(step.failed)
		}
	}
}

// rejoinStep is what rejoin had to do, as its logs say it.
type rejoinStep struct{ done, failed string }

var (
	recreate = &rejoinStep{
		done:   "durable consumer was gone; created it again and rejoined",
		failed: "durable consumer is gone and cannot be created yet",
	}
	reopen = &rejoinStep{
		done:   "subscription ended while the durable exists (created again by another member of the group); subscribed again",
		failed: "subscription ended and cannot be opened again yet",
	}
)

// rejoin looks at the durable once and subscribes again when it must: the
// durable is gone (it creates it again), or the subscription ended while
// the durable exists. It returns the step it took and how that went; nil
// when there was nothing to do, or the look itself failed (the next look
// tries again).
func (l *Loop) rejoin(ctx context.Context, sub *subscription) (*rejoinStep, error) {
	ended := sub.ended()
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	cons, err := l.js.Consumer(ctx, l.cfg.Stream.Name, l.cfg.Consumer.Name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		if cons, err = l.provision(ctx); err != nil {
			return recreate, err
		}
		return recreate, sub.open(cons, l.options()...)
	case err == nil && ended:
		return reopen, sub.open(cons, l.options()...)
	}
	return nil, nil
}

// subscription is the loop's message iterator, which watch replaces when
// the durable had to be created again.
type subscription struct {
	mu   sync.Mutex
	iter jetstream.MessagesContext
	// changed is closed when iter is replaced.
	changed chan struct{}
	// drained is set once shutdown drained the iterator: no replacement
	// after that.
	drained bool
	// over is the iterator that ended by itself, as the fetch loop found
	// it; nil when the current one works.
	over jetstream.MessagesContext
}

func (s *subscription) open(cons jetstream.Consumer, opts ...jetstream.PullMessagesOpt) error {
	it, err := cons.Messages(opts...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drained {
		it.Stop()
		return nil
	}
	old := s.iter
	s.iter = it
	s.over = nil
	if s.changed != nil {
		close(s.changed)
	}
	s.changed = make(chan struct{})
	if old != nil {
		// The fetch loop sees the old iterator closed and, finding it
		// replaced, goes on with the new one.
		old.Stop()
	}
	return nil
}

// end records that it ended by itself.
func (s *subscription) end(it jetstream.MessagesContext) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.iter == it {
		s.over = it
	}
}

// ended reports whether the current iterator ended by itself.
func (s *subscription) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.over != nil && s.over == s.iter
}

func (s *subscription) current() jetstream.MessagesContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.iter
}

// await waits until an iterator other than it is open, and reports false
// when ctx ends first.
func (s *subscription) await(ctx context.Context, it jetstream.MessagesContext) bool {
	s.mu.Lock()
	current, changed := s.iter, s.changed
	s.mu.Unlock()
	if current != it {
		return true
	}
	select {
	case <-changed:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *subscription) drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drained = true
	s.iter.Drain()
}

func (s *subscription) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.iter.Stop()
}
