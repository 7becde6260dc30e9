package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	batonnats "github.com/batonhq/baton/nats"
)

// subscription is the worker's message iterator on the durable consumer,
// which watchConsumer replaces when the consumer had to be created again.
type subscription struct {
	mu   sync.Mutex
	iter jetstream.MessagesContext
	// changed is closed when iter is replaced.
	changed chan struct{}
	// drained is set once shutdown drained the iterator: no replacement
	// after that.
	drained bool
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

func (w *Worker) pullOptions() []jetstream.PullMessagesOpt {
	return []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(max(2*w.cfg.Concurrency, 64))}
}

// watchConsumer checks every RecoveryInterval that the durable consumer
// still exists, and creates it again, with a new subscription, when it does
// not. A stream lost with all its data (every NATS node's store gone) comes
// back empty, recreated by the relay, without the consumer: the iterator
// then waits forever on a consumer that no longer exists, and no trigger,
// not even the sweeper's, reaches this worker again.
func (w *Worker) watchConsumer(ctx context.Context, sub *subscription) {
	t := time.NewTicker(w.cfg.RecoveryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.cfg.JetStream.Consumer(checkCtx, w.cfg.Stream.Name, w.cfg.Consumer.Name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			var cons jetstream.Consumer
			cons, err = batonnats.EnsureConsumer(checkCtx, w.cfg.JetStream, w.cfg.Stream, w.cfg.Consumer)
			if err == nil {
				err = sub.open(cons, w.pullOptions()...)
			}
			if err == nil {
				w.log.Warn().Str("stream", w.cfg.Stream.Name).Str("consumer", w.cfg.Consumer.Name).Msg("consumer was gone; created it again")
			} else if ctx.Err() == nil {
				// The stream may not be back yet; the next tick looks again.
				w.log.Warn().Err(err).Msg("consumer is gone and could not be created again")
			}
		}
		cancel()
	}
}
