package api

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	batonnats "github.com/batonhq/baton/nats"
)

// sseHeartbeat keeps idle streams alive through proxies and lets a client
// notice a dead connection.
const sseHeartbeat = 15 * time.Second

// DefaultStreamRecheck is how often an open event stream checks again
// that its conversation still exists and is still its user's.
const DefaultStreamRecheck = 30 * time.Second

// follower follows one conversation for one stream to a client, in four
// steps: subscribe (to the conversation's events and live deltas in the
// hub, before anything the stream shows is read, so that nothing
// committed from then on is missed), catch up (the stream sends what came
// before: the events after the client's Last-Event-ID, or the turn's state
// and the worker's snapshot of its reply), follow (every event and live
// delta the hub hands on, heartbeats, and checks against the database for
// what a lost event would have said), and end (the stream's last word, the
// client's leaving or the server's closing; then unsubscribe).
//
// What the stream makes of it all is its protocol's (clientStream):
// Baton's conversation events (eventStream) or the reply of one turn as
// the AI SDK's UI message stream (chatStream).
type follower struct {
	s   *Server
	key string // the conversation's key
	l   *listener
	// position is the hub's position when the follower subscribed: every
	// event after it reaches l; replay reads those before it.
	position uint64
	// handed is the newest event handed to the stream: replay and the hub
	// overlap.
	handed uint64
	// expires, when set, is when the client's token expires: its stream
	// ends at that moment, not at the next recheck.
	expires time.Time
}

// clientStream is one open stream to a client, in its protocol. A
// follower calls it from the request's goroutine only, and stops once it
// is done.
type clientStream interface {
	// catchUp opens the stream and sends what the client lacks from before
	// f subscribed.
	catchUp(ctx context.Context, f *follower)
	// event takes a committed change of the conversation, seq its position
	// in the events stream.
	event(ctx context.Context, seq uint64, ev batonnats.ConversationEvent)
	// delta takes a live delta of the conversation, from any run.
	delta(ctx context.Context, d *liveDelta)
	// recheck asks the database what a lost event would have said.
	recheck(ctx context.Context)
	// lagged is told that the hub dropped events for this stream.
	lagged(ctx context.Context)
	// closing is told that the server closes; the follower stops after.
	closing()
	// gone is told that the events stream was made anew: the hub forgot
	// every subscription, and nothing more comes.
	gone()
	// expired is told that the client's token expired (follower.expires).
	expired()

	// Writing, as the stream's sseWriter does it.
	keepAlive()
	flush()
	done() bool
}

// errStreamDone stops a replay whose stream is done.
var errStreamDone = errors.New("stream done")

// subscribe starts following the conversation with the given key: every
// event and live delta of it from now on reaches the follower. The
// caller unsubscribes when its stream is over.
func (s *Server) subscribe(key string) *follower {
	l, position := s.hub.listen(key)
	return &follower{s: s, key: key, l: l, position: position}
}

func (f *follower) unsubscribe() { f.s.hub.forget(f.key, f.l) }

// follow runs st from its catch-up to its end, the client's leaving or the
// server's closing.
func (f *follower) follow(ctx context.Context, st clientStream) {
	st.catchUp(ctx, f)
	st.flush()
	heartbeat := time.NewTicker(sseHeartbeat)
	defer heartbeat.Stop()
	recheck := time.NewTicker(f.s.cfg.StreamRecheck)
	defer recheck.Stop()
	var expiry <-chan time.Time
	if !f.expires.IsZero() {
		t := time.NewTimer(time.Until(f.expires))
		defer t.Stop()
		expiry = t.C
	}
	gone := f.l.gone
	for !st.done() {
		select {
		case <-ctx.Done():
			return
		case <-f.s.closing:
			st.closing()
			return
		case <-gone:
			gone = nil // closed for good: told once
			st.gone()
		case <-expiry:
			st.expired()
		case e := <-f.l.events:
			f.event(ctx, st, e)
		case d := <-f.l.deltas:
			st.delta(ctx, d)
		case <-heartbeat.C:
			st.keepAlive()
		case <-recheck.C:
			st.recheck(ctx)
		}
		if !st.done() && f.l.lagging.Swap(false) {
			st.lagged(ctx)
		}
		f.drain(ctx, st)
		st.flush()
	}
}

// drain hands on what else is already waiting, so that one flush sends it
// all: a busy conversation costs a write per burst, not per event.
func (f *follower) drain(ctx context.Context, st clientStream) {
	for range listenerEvents + listenerDeltas {
		if st.done() {
			return
		}
		select {
		case e := <-f.l.events:
			f.event(ctx, st, e)
		case d := <-f.l.deltas:
			st.delta(ctx, d)
		default:
			return
		}
	}
}

// replay hands st the conversation's events after seq after, up to the
// subscription, read from the events stream: what a resuming client
// missed.
func (f *follower) replay(ctx context.Context, st clientStream, after uint64) error {
	f.handed = after
	subject := f.s.eventsCfg.Subject(f.key)
	return f.s.hub.catchUp(ctx, subject, after+1, f.position, func(e hubEvent) error {
		f.event(ctx, st, e)
		if st.done() {
			return errStreamDone
		}
		return nil
	})
}

// event hands st one committed change, once: an event that both replay
// and the hub read is handed by the first.
func (f *follower) event(ctx context.Context, st clientStream, e hubEvent) {
	if e.seq <= f.handed {
		return
	}
	f.handed = e.seq
	var ev batonnats.ConversationEvent
	if json.Unmarshal(e.data, &ev) != nil {
		return
	}
	st.event(ctx, e.seq, ev)
}
