package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Buffers of one open event stream: what the hub holds for a client that
// is slower than the events. A stream that falls further behind is closed
// and the client, reconnecting with Last-Event-ID, catches up from the
// stream.
const (
	listenerEvents = 64
	listenerDeltas = 64
)

// hub follows the events stream and the live subjects once per API
// process, and hands each conversation's events to the streams open on it:
// thousands of clients cost one JetStream consumer and one subscription,
// not one each, and a wave of reconnecting clients costs no more than
// their steady state.
type hub struct {
	js  jetstream.JetStream
	nc  *natsclient.Conn
	cfg batonnats.EventsConfig
	log zerolog.Logger
	// slow counts the deltas dropped for a listener whose buffer is full.
	slow prometheus.Counter

	mu        sync.Mutex
	listeners map[string]map[*listener]struct{} // by conversation key
	// position is the newest event the hub has handed out: a listener
	// registered now gets every event after it.
	position uint64
	// first and last cache the stream's bounds for resuming clients;
	// origin is the sequence its first event had (or would have): events
	// are numbered from the moment the stream was made, not from 1.
	first, last, origin uint64
	boundsAt            time.Time

	// startMu guards following: started once it works, retried (at most
	// once every retry) while it fails, never again once closed.
	startMu sync.Mutex
	started bool
	closed  bool
	retry   time.Duration
	lastTry time.Time
	lastErr error
	stop    context.CancelFunc
	done    chan struct{}
}

// hubStartRetry is how soon a hub that could not start following (NATS or
// the events stream away) tries again, when a client asks.
const hubStartRetry = time.Second

var errHubClosed = errors.New("api: closed")

// listener is one open event stream's inbox.
type listener struct {
	events chan hubEvent
	deltas chan *liveDelta
	// lagging is set when the hub had to drop an event for it.
	lagging atomic.Bool
	// gone is closed when the events stream the listener followed is
	// gone: the client connects again and is told to reload.
	gone chan struct{}
}

// liveDelta is one live delta as the hub read it, once for every
// listener of its conversation.
type liveDelta struct {
	// runID is the run the delta names, valid only when fromRun.
	runID string
	// fromRun is set when the delta parsed and came on the live subject of
	// the run it names: a delta published on another run's subject is a
	// forgery and never reaches a client.
	fromRun bool
	// delta is the delta as parsed, valid only when fromRun.
	delta batonnats.LiveDelta
	// frame is the delta as an SSE event, written as it is to every
	// client that gets it.
	frame []byte
}

type hubEvent struct {
	seq  uint64
	data []byte
}

func newHub(js jetstream.JetStream, nc *natsclient.Conn, cfg batonnats.EventsConfig, log zerolog.Logger, slow prometheus.Counter) *hub {
	return &hub{js: js, nc: nc, cfg: cfg, log: log, slow: slow, retry: hubStartRetry, listeners: map[string]map[*listener]struct{}{}}
}

// start follows the stream from its current end. Once that works, later
// calls return nil at once; while it fails (NATS or the events stream is
// away), a call within retry of the last attempt returns that attempt's
// error, and a later one tries again.
func (h *hub) start() error {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	switch {
	case h.closed:
		return errHubClosed
	case h.started:
		return nil
	case !h.lastTry.IsZero() && time.Since(h.lastTry) < h.retry:
		return h.lastErr
	}
	h.lastTry = time.Now()
	h.lastErr = h.follow()
	h.started = h.lastErr == nil
	return h.lastErr
}

// hubWatch is how often the hub checks that the events stream it follows
// is still the one it started on.
const hubWatch = 2 * time.Second

// follow starts the goroutine that hands out the stream's events, and the
// subscription to the live subjects.
func (h *hub) follow() error {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := h.js.Stream(ctx, h.cfg.Name)
	if err != nil {
		cancel()
		return err
	}
	info := stream.CachedInfo()
	state := info.State
	h.mu.Lock()
	h.position, h.first, h.last, h.origin, h.boundsAt = state.LastSeq, state.FirstSeq, state.LastSeq, max(info.Config.FirstSeq, 1), time.Now()
	h.mu.Unlock()
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{h.cfg.SubjectPrefix + ".>"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    state.LastSeq + 1,
	})
	if err != nil {
		cancel()
		return err
	}
	iter, err := cons.Messages()
	if err != nil {
		cancel()
		return err
	}
	var sub *natsclient.Subscription
	if h.nc != nil {
		sub, err = h.nc.Subscribe(batonnats.LivePrefix+".>", h.delta)
		if err != nil {
			iter.Stop()
			cancel()
			return err
		}
	}
	done := make(chan struct{})
	h.stop, h.done = cancel, done
	// The iteration ends with ctx, or when the stream it reads was made
	// anew (wiped and provisioned again): an ordered consumer would go on
	// from the old stream's position, which the new stream's events reach
	// only much later, and every open stream would fall silent.
	ictx, stopIter := context.WithCancel(ctx)
	var recreated atomic.Bool
	var watcher sync.WaitGroup
	watcher.Go(func() {
		h.watch(ictx, info.Created, func() {
			recreated.Store(true)
			stopIter()
		})
	})
	go func() {
		defer close(done)
		context.AfterFunc(ictx, iter.Stop)
		for {
			m, err := iter.Next()
			if err != nil {
				if ictx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					break
				}
				// The ordered consumer recreates itself after a lost
				// connection; do not spin meanwhile.
				select {
				case <-ictx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			h.event(m)
		}
		stopIter()
		watcher.Wait()
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		if recreated.Load() && ctx.Err() == nil {
			h.restart()
		}
	}()
	return nil
}

// watch calls recreated once the events stream is no longer the one made
// at created, until ctx ends. A stream that is missing (wiped, not yet
// provisioned again) is waited for.
func (h *hub) watch(ctx context.Context, created time.Time, recreated func()) {
	t := time.NewTicker(hubWatch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, hubWatch)
		stream, err := h.js.Stream(qctx, h.cfg.Name)
		cancel()
		if err == nil && !stream.CachedInfo().Created.Equal(created) {
			h.log.Warn().Str("stream", h.cfg.Name).Msg("the events stream was made anew; open event streams end and their clients reload")
			recreated()
			return
		}
	}
}

// restart ends every open stream, whose client then connects again and,
// its Last-Event-ID belonging to the old stream, is told to reload; and
// follows the new stream from its end.
func (h *hub) restart() {
	h.mu.Lock()
	for _, ls := range h.listeners {
		for l := range ls {
			close(l.gone)
		}
	}
	h.listeners = map[string]map[*listener]struct{}{}
	h.position, h.first, h.last, h.origin, h.boundsAt = 0, 0, 0, 0, time.Time{}
	h.mu.Unlock()
	h.startMu.Lock()
	h.started, h.lastTry = false, time.Time{}
	h.startMu.Unlock()
	if err := h.start(); err != nil && !errors.Is(err, errHubClosed) {
		h.log.Warn().Err(err).Msg("follow the events stream made anew; the next client to connect tries again")
	}
}

// close stops following, and keeps the hub from starting again; open
// streams end on their own (Server.Close).
func (h *hub) close() {
	h.startMu.Lock()
	h.closed = true
	stop, done := h.stop, h.done
	h.startMu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// event hands one event to the listeners of its conversation.
func (h *hub) event(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		return
	}
	key, ok := h.keyOf(m.Subject(), h.cfg.SubjectPrefix+".")
	h.mu.Lock()
	defer h.mu.Unlock()
	h.position = max(h.position, md.Sequence.Stream)
	if !ok {
		return
	}
	ev := hubEvent{seq: md.Sequence.Stream, data: m.Data()}
	for l := range h.listeners[key] {
		select {
		case l.events <- ev:
		default:
			l.lagging.Store(true)
		}
	}
}

// delta hands one live delta to the listeners of its conversation, read
// once for all of them.
func (h *hub) delta(m *natsclient.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, batonnats.LivePrefix+".")
	if !ok {
		return
	}
	token, _, _ := strings.Cut(rest, ".")
	key, err := batonnats.DecodeToken(token)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ls := h.listeners[key]
	if len(ls) == 0 {
		return
	}
	d := &liveDelta{frame: sseFrame("", "delta", string(m.Data))}
	if parsed, err := batonnats.ParseLiveDelta(m.Data); err == nil {
		d.runID, d.fromRun, d.delta = parsed.RunID, m.Subject == batonnats.LiveSubject(key, parsed.RunID), parsed
	}
	for l := range ls {
		select {
		case l.deltas <- d:
		default:
			// A preview lost, never a reply: deltas are worth nothing
			// once the turn ends.
			h.slow.Inc()
		}
	}
}

func (h *hub) keyOf(subject, prefix string) (string, bool) {
	token, ok := strings.CutPrefix(subject, prefix)
	if !ok || strings.Contains(token, ".") {
		return "", false
	}
	key, err := batonnats.DecodeToken(token)
	return key, err == nil
}

// listen registers a listener for a conversation and returns it with the
// hub's position: every event after that position reaches the listener.
func (h *hub) listen(key string) (*listener, uint64) {
	l := &listener{events: make(chan hubEvent, listenerEvents), deltas: make(chan *liveDelta, listenerDeltas), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.listeners[key] == nil {
		h.listeners[key] = map[*listener]struct{}{}
	}
	h.listeners[key][l] = struct{}{}
	return l, h.position
}

func (h *hub) forget(key string, l *listener) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.listeners[key][l]; !ok {
		return // ended by restart
	}
	delete(h.listeners[key], l)
	if len(h.listeners[key]) == 0 {
		delete(h.listeners, key)
	}
}

// bounds returns the stream's first and last sequences and its origin
// (the sequence of its first event ever), read at most once a second: a
// wave of reconnecting clients asks the server once, not once each.
func (h *hub) bounds(ctx context.Context) (first, last, origin uint64, err error) {
	h.mu.Lock()
	fresh := time.Since(h.boundsAt) < time.Second
	first, last, origin = h.first, max(h.last, h.position), h.origin
	h.mu.Unlock()
	if fresh {
		return first, last, origin, nil
	}
	stream, err := h.js.Stream(ctx, h.cfg.Name)
	if err != nil {
		return 0, 0, 0, err
	}
	info := stream.CachedInfo()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.first, h.last, h.origin, h.boundsAt = info.State.FirstSeq, info.State.LastSeq, max(info.Config.FirstSeq, 1), time.Now()
	return h.first, max(h.last, h.position), h.origin, nil
}

// catchUp sends the events of subject after seq from up to through
// (inclusive), oldest first, reading them from the stream one by one.
func (h *hub) catchUp(ctx context.Context, subject string, from, through uint64, send func(hubEvent) error) error {
	if from > through {
		return nil
	}
	stream, err := h.js.Stream(ctx, h.cfg.Name)
	if err != nil {
		return err
	}
	for seq := from; seq <= through; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.Sequence > through {
			return nil
		}
		if err := send(hubEvent{seq: m.Sequence, data: m.Data}); err != nil {
			return err
		}
		seq = m.Sequence + 1
	}
	return nil
}
