package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	batonnats "github.com/batonhq/baton/nats"
)

// Retries of a publication that found no stream listening (JetStream still
// starting, or a stream leader being elected), as jetstream.PublishMsgAsync
// does by default.
const (
	noResponderRetries   = jetstream.DefaultPubRetryAttempts
	noResponderRetryWait = jetstream.DefaultPubRetryWait
)

// publisher publishes one session's events to JetStream asynchronously and
// handles their acknowledgements as they arrive, on the connection's own
// delivery goroutine: no future, channel or timer per event, and no hand-off
// to another goroutine before the tracker learns of an acknowledgement.
//
// Every publication carries a reply subject of its own under one wildcard
// subscription. At most max events are in flight; publish blocks while they
// are. The first failure (a negative or unreadable acknowledgement, none
// within the timeout, a lost connection) is final: fail records it, closes
// failed and calls onFail, and the session restarts from the slot.
type publisher struct {
	nc      *natsclient.Conn
	prefix  string // reply subjects are prefix + sequence
	timeout time.Duration
	slots   chan struct{} // one token per event in flight
	onAck   func(ev *inflight, at time.Time)
	onFail  func()
	// rebuild makes the message of an event again, to resend it.
	rebuild func(*batonnats.Trigger) (*natsclient.Msg, error)

	sub    *natsclient.Subscription
	status chan natsclient.Status
	stop   chan struct{}
	done   chan struct{}

	// delivering is held while an acknowledgement is handled; closed,
	// under it, keeps any from being handled once close returns.
	delivering sync.Mutex
	closed     bool

	mu      sync.Mutex
	next    uint64 // the sequence of the next publication
	low     uint64 // no event below it is pending
	pending map[uint64]*inflight
	empty   chan struct{} // closed when pending drains; see drained

	failOnce sync.Once
	failed   chan struct{}
	err      error // set before failed is closed
}

// inflight is one event published and not yet acknowledged.
type inflight struct {
	reply   string
	txn     *txn
	trigger batonnats.Trigger
	sent    time.Time // first sent: resending does not extend the timeout
	retries int
	// span is the event's publish span, ended at its acknowledgement; nil
	// for a row without trace context.
	span trace.Span
}

func newPublisher(nc *natsclient.Conn, max int, timeout time.Duration, rebuild func(*batonnats.Trigger) (*natsclient.Msg, error),
	onAck func(*inflight, time.Time), onFail func(),
) (*publisher, error) {
	p := &publisher{
		nc:      nc,
		prefix:  nc.NewInbox() + ".",
		timeout: timeout,
		slots:   make(chan struct{}, max),
		onAck:   onAck,
		onFail:  onFail,
		rebuild: rebuild,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		pending: make(map[uint64]*inflight, max),
		failed:  make(chan struct{}),
	}
	// Acknowledgements in flight when the connection drops are lost, as
	// jetstream's async publisher assumes too: fail at once rather than
	// waiting for the timeout.
	p.status = nc.StatusChanged(natsclient.RECONNECTING, natsclient.CLOSED)
	sub, err := nc.Subscribe(p.prefix+"*", p.handle)
	if err != nil {
		nc.RemoveStatusListener(p.status)
		return nil, fmt.Errorf("subscribe to JetStream acknowledgements: %w", err)
	}
	// The relay bounds what is in flight; the subscription must never drop
	// an acknowledgement as a slow consumer.
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	go p.watch()
	return p, nil
}

// close stops the publisher. Acknowledgements that arrive later are
// ignored.
func (p *publisher) close() {
	close(p.stop)
	<-p.done
	_ = p.sub.Unsubscribe()
	p.nc.RemoveStatusListener(p.status)
	p.delivering.Lock()
	p.closed = true
	p.delivering.Unlock()
}

// publish sends msg, the message of trigger t of transaction x, waiting
// while the in-flight bound is reached. The caller counts the event in the
// tracker before: its acknowledgement may arrive before publish returns.
// msg is not used after publish returns.
func (p *publisher) publish(msg *natsclient.Msg, x *txn, t *batonnats.Trigger, span trace.Span, cancel <-chan struct{}) error {
	select {
	case p.slots <- struct{}{}:
	default:
		select {
		case p.slots <- struct{}{}:
		case <-p.failed:
			return p.err
		case <-cancel:
			return errPublishCancelled
		}
	}
	ev := &inflight{txn: x, trigger: *t, sent: time.Now(), span: span}
	p.mu.Lock()
	seq := p.next
	p.next++
	ev.reply = p.prefix + strconv.FormatUint(seq, 10)
	p.pending[seq] = ev
	p.mu.Unlock()
	msg.Reply = ev.reply
	if err := p.nc.PublishMsg(msg); err != nil {
		p.mu.Lock()
		delete(p.pending, seq)
		p.mu.Unlock()
		<-p.slots
		return sendError{err}
	}
	return nil
}

var errPublishCancelled = errors.New("publication cancelled")

// sendError is a publication the NATS connection refused.
type sendError struct{ err error }

func (e sendError) Error() string { return e.err.Error() }
func (e sendError) Unwrap() error { return e.err }

// handle receives one acknowledgement.
func (p *publisher) handle(m *natsclient.Msg) {
	p.delivering.Lock()
	defer p.delivering.Unlock()
	if p.closed || len(m.Subject) <= len(p.prefix) {
		return
	}
	seq, err := strconv.ParseUint(m.Subject[len(p.prefix):], 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	ev := p.pending[seq]
	if ev == nil {
		// Timed out or failed already: the session is ending.
		p.mu.Unlock()
		return
	}
	if len(m.Data) == 0 && m.Header.Get(jetstreamStatusHeader) == noRespondersStatus && ev.retries < noResponderRetries {
		ev.retries++
		p.mu.Unlock()
		time.AfterFunc(noResponderRetryWait, func() { p.resend(seq) })
		return
	}
	delete(p.pending, seq)
	var empty chan struct{}
	if len(p.pending) == 0 && p.empty != nil {
		empty, p.empty = p.empty, nil
	}
	p.mu.Unlock()
	<-p.slots

	if err := ackError(m); err != nil {
		p.fail(fmt.Errorf("JetStream did not acknowledge outbox row %d: %w", ev.trigger.OutboxID, err))
	} else {
		p.onAck(ev, time.Now())
	}
	if empty != nil {
		close(empty)
	}
}

// resend publishes an event again after JetStream had no responder for it.
func (p *publisher) resend(seq uint64) {
	p.delivering.Lock()
	defer p.delivering.Unlock()
	if p.closed {
		return
	}
	p.mu.Lock()
	ev := p.pending[seq]
	p.mu.Unlock()
	if ev == nil {
		return
	}
	msg, err := p.rebuild(&ev.trigger)
	if err == nil {
		msg.Reply = ev.reply
		err = p.nc.PublishMsg(msg)
	}
	if err != nil {
		p.fail(fmt.Errorf("publish outbox row %d again: %w", ev.trigger.OutboxID, err))
	}
}

// JetStream's reply without a stream to store the message.
const (
	jetstreamStatusHeader = "Status"
	noRespondersStatus    = "503"
)

// ackError reports what is wrong with a JetStream acknowledgement, nil for
// a good one. The common case, {"stream":"S","seq":N[,"duplicate":true]},
// is recognised without a JSON decoder; anything else is decoded in full.
func ackError(m *natsclient.Msg) error {
	data := m.Data
	if len(data) == 0 {
		if m.Header.Get(jetstreamStatusHeader) == noRespondersStatus {
			return jetstream.ErrNoStreamResponse
		}
		return jetstream.ErrInvalidJSAck
	}
	if plainPubAck(data) {
		return nil
	}
	// As jetstream decodes it.
	var pa struct {
		Type  string              `json:"type"`
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &pa); err != nil {
		return jetstream.ErrInvalidJSAck
	}
	if pa.Error != nil {
		return pa.Error
	}
	if pa.PubAck == nil || pa.Stream == "" {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}

// plainPubAck reports whether data is a successful acknowledgement made
// only of the fields JetStream sends for a stored or duplicate message:
// {"stream":"<name>","seq":<n>} with optional "domain" and "duplicate".
// It errs on the side of false, which sends data to the full decoder.
func plainPubAck(data []byte) bool {
	const head = `{"stream":"`
	if !bytes.HasPrefix(data, []byte(head)) || data[len(data)-1] != '}' {
		return false
	}
	rest := data[len(head):]
	end := plainString(rest)
	if end <= 0 {
		return false
	}
	rest = rest[end+1 : len(rest)-1]
	// What follows the stream name: only known fields, no error.
	for len(rest) > 0 {
		switch {
		case bytes.HasPrefix(rest, []byte(`,"seq":`)):
			rest = rest[len(`,"seq":`):]
			n := 0
			for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
				n++
			}
			// JSON numbers have no leading zero; 19 digits fit a uint64.
			if n == 0 || n > 19 || n > 1 && rest[0] == '0' {
				return false
			}
			rest = rest[n:]
		case bytes.HasPrefix(rest, []byte(`,"duplicate":true`)):
			rest = rest[len(`,"duplicate":true`):]
		case bytes.HasPrefix(rest, []byte(`,"duplicate": true`)):
			// How nats-server writes the acknowledgement of a duplicate.
			rest = rest[len(`,"duplicate": true`):]
		case bytes.HasPrefix(rest, []byte(`,"duplicate":false`)):
			rest = rest[len(`,"duplicate":false`):]
		case bytes.HasPrefix(rest, []byte(`,"domain":"`)):
			rest = rest[len(`,"domain":"`):]
			end := plainString(rest)
			if end < 0 {
				return false
			}
			rest = rest[end+1:]
		default:
			return false
		}
	}
	return true
}

// plainString returns the length of the JSON string at the start of b,
// up to its closing quote, if it holds no escape and no control character;
// -1 otherwise.
func plainString(b []byte) int {
	for i, c := range b {
		switch {
		case c == '"':
			return i
		case c < 0x20 || c == '\\':
			return -1
		}
	}
	return -1
}

// fail records the first failure and wakes whoever waits on the session.
func (p *publisher) fail(err error) {
	p.failOnce.Do(func() {
		p.err = err
		close(p.failed)
		if p.onFail != nil {
			p.onFail()
		}
	})
}

// drained returns a channel closed once no event is in flight.
func (p *publisher) drained() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if p.empty == nil {
		p.empty = make(chan struct{})
	}
	return p.empty
}

// watch fails the publisher when an event waits longer than the timeout
// for its acknowledgement, or when the connection is lost.
func (p *publisher) watch() {
	defer close(p.done)
	tick := time.NewTicker(min(max(p.timeout/10, time.Millisecond), 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.failed:
			return
		case s, ok := <-p.status:
			if ok {
				p.fail(fmt.Errorf("NATS connection %s: events in flight lost: %w", s, natsclient.ErrDisconnected))
			}
			return
		case now := <-tick.C:
			if ev := p.expired(now); ev != nil {
				p.fail(fmt.Errorf("JetStream did not acknowledge outbox row %d: %w", ev.trigger.OutboxID, jetstream.ErrAsyncPublishTimeout))
				return
			}
		}
	}
}

// expired returns the oldest event in flight if it waited longer than the
// timeout. Events are sent in sequence order, so the oldest is the pending
// one of lowest sequence.
func (p *publisher) expired(now time.Time) *inflight {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; p.low < p.next; p.low++ {
		if ev := p.pending[p.low]; ev != nil {
			if now.Sub(ev.sent) >= p.timeout {
				return ev
			}
			return nil
		}
	}
	return nil
}
