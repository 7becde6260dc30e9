package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/time/rate"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// maxRunLookups is how many times a second an event stream may ask the
// database which run holds its conversation.
const maxRunLookups = 5

// Reasons an event stream ends, sent in its final "end" event.
const (
	endDeleted = "conversation_deleted"
	endClosing = "server_closing"
	endRevoked = "token_revoked"
	endExpired = "token_expired"
)

// publishEvent announces a committed change to live clients. A lost publish
// leaves a client stale until its next event or reconnect, never wrong, so
// it is logged and the request still succeeds: its transaction committed.
func (s *Server) publishEvent(ctx context.Context, ev batonnats.ConversationEvent, msgID string) {
	if s.events == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.events.Publish(ctx, ev, msgID); err != nil {
		s.log.Warn().Err(err).Str("conversation_id", ev.ConversationID).Str("event", string(ev.Type)).Msg("could not publish conversation event")
	}
}

// conversationEvents streams a conversation's committed state changes as
// server-sent events. Each event's id is its sequence in the events
// stream; a client that reconnects with Last-Event-ID resumes right after
// it, or, when that point is older than the stream's retention, gets a
// "reset" event telling it to reload the state first. Without
// Last-Event-ID the stream starts with a "ready" event, after which the
// client loads the state: nothing committed after "ready" is missed.
// Partial reply text arrives as "delta" events without ids: it is
// ephemeral, and the durable reply is the "replied" event's message.
func (s *Server) conversationEvents(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	user := userFrom(ctx)
	conv, err := schema.GetConversation(ctx, s.pool, user.ID, cid)
	if err != nil {
		if errors.Is(err, schema.ErrNotFound) {
			s.notFound(w, cid)
		} else {
			s.internalError(w, r, err)
		}
		return
	}
	release, err := s.acquireStream(user.ID)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	defer release()
	if !s.eventsLive(w) {
		return
	}
	resumeFrom, ok := lastEventID(w, r)
	if !ok {
		return
	}
	// Subscribed before the stream's bounds are read, so that no event
	// falls between what the catch-up reads and what the hub hands on.
	f := s.subscribe(conv.Key)
	defer f.unsubscribe()
	st := &eventStream{sseWriter: newSSEWriter(w), s: s, user: user, conv: conv, cid: cid, opening: "ready", current: conv.RunID,
		lookups: rate.NewLimiter(rate.Limit(maxRunLookups), maxRunLookups)}
	if resumeFrom > 0 {
		if err := st.resume(ctx, resumeFrom); err != nil {
			s.log.Warn().Err(err).Msg("read the events stream's bounds")
			writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events are not available right now; try again shortly")
			return
		}
	}
	f.expires = user.TokenExpiresAt
	f.follow(ctx, st)
}

// eventsLive checks that the process follows the events stream, and
// answers 503 when it does not.
func (s *Server) eventsLive(w http.ResponseWriter) bool {
	if s.js == nil {
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events need NATS: start the API with --nats-url / BATON_NATS_URL")
		return false
	}
	if err := s.hub.start(); err != nil {
		s.log.Warn().Err(err).Msg("cannot follow the events stream")
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events are not available right now; try again shortly")
		return false
	}
	return true
}

// lastEventID returns the sequence after the client's Last-Event-ID (a
// header, or a query parameter for clients that cannot set one), 0 when it
// sent none. It has answered 400 when ok is false.
func lastEventID(w http.ResponseWriter, r *http.Request) (resumeFrom uint64, ok bool) {
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = r.URL.Query().Get("last_event_id")
	}
	if lastID == "" {
		return 0, true
	}
	n, err := strconv.ParseUint(lastID, 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_last_event_id", "Last-Event-ID must be the id of an event this endpoint sent")
		return 0, false
	}
	return n + 1, true
}

// eventStream is Baton's own protocol over a follower: every committed
// change of the conversation as an event whose id is its sequence in the
// events stream, and the live deltas of the run that holds the
// conversation as "delta" events without ids.
type eventStream struct {
	*sseWriter
	s    *Server
	user schema.User
	conv schema.Conversation
	cid  string // the conversation's id, as the client knows it

	// opening is the event the stream opens with: "ready" (the client
	// loads the state after it), "reset" (what came after the client's
	// Last-Event-ID is gone: it reloads), or "" when it resumes after
	// resumeAfter.
	opening     string
	resumeAfter uint64

	// Live deltas are forwarded only from the run that holds the
	// conversation, current, as the database and the conversation events
	// say: a delta anyone else publishes on the live subject never
	// reaches the client. lookups limits the database's being asked;
	// lastRun is the run it was last asked about, at lastLookup.
	current    string
	lookups    *rate.Limiter
	lastRun    string
	lastLookup time.Time
}

// resume decides how the stream of a client that saw every event before
// resumeFrom opens: right after it, or with "reset" when the events stream
// no longer holds what came after it.
func (e *eventStream) resume(ctx context.Context, resumeFrom uint64) error {
	firstSeq, lastSeq, origin, err := e.s.hub.bounds(ctx)
	if err != nil {
		return err
	}
	if resumeFrom == 1 {
		// Last-Event-ID 0: the client saw nothing of the stream and asks
		// for all of it, from its first event.
		resumeFrom = origin
	}
	switch {
	case resumeFrom-1 > lastSeq:
		// From another stream (reset or recreated): reload.
		e.opening = "reset"
	case resumeFrom < firstSeq:
		// What came after the client's event is gone from retention:
		// reload.
		e.opening = "reset"
	default:
		e.opening, e.resumeAfter = "", resumeFrom-1
	}
	return nil
}

// catchUp opens the stream: with "ready" or "reset", whose id is the
// position the stream follows from; or, resuming, with what the client
// missed, read from the events stream.
func (e *eventStream) catchUp(ctx context.Context, f *follower) {
	e.header().Set("Cache-Control", "no-store")
	e.open()
	if e.opening != "" {
		id := strconv.FormatUint(f.position, 10)
		e.send(id, e.opening, fmt.Sprintf(`{"last_event_id":%s}`, id))
		e.flush()
		return
	}
	// Confirmed at once so that the client knows it is live even when
	// nothing happens for a while.
	e.comment("resumed")
	e.flush()
	if err := f.replay(ctx, e, e.resumeAfter); err != nil && !errors.Is(err, errStreamDone) {
		if ctx.Err() == nil {
			e.s.log.Warn().Err(err).Msg("catch up an event stream")
		}
		e.close()
	}
}

func (e *eventStream) event(_ context.Context, seq uint64, ev batonnats.ConversationEvent) {
	if ev.At.Before(e.conv.CreatedAt) {
		// Never anything from before the conversation existed.
		return
	}
	switch ev.Type {
	case batonnats.EventProcessing:
		e.current = ev.RunID
	case batonnats.EventReplied, batonnats.EventFailed, batonnats.EventPending, batonnats.EventWaiting, batonnats.EventCancelled, batonnats.EventWaitingForApproval:
		if ev.RunID == e.current {
			e.current = ""
		}
	}
	// The client knows the conversation by its own id. The outbox rows
	// are the server's: their ids count the messages of every
	// conversation, and consumers inside read them from the events
	// stream itself.
	ev.ConversationID = e.cid
	ev.OutboxIDs = nil
	body, _ := json.Marshal(ev)
	e.send(strconv.FormatUint(seq, 10), "", string(body))
	if ev.Type == batonnats.EventDeleted {
		e.end(endDeleted)
	}
}

func (e *eventStream) delta(ctx context.Context, d *liveDelta) {
	if d.fromRun && d.runID != e.current && (d.runID != e.lastRun || time.Since(e.lastLookup) > time.Second) && e.lookups.Allow() {
		// The delta may have overtaken the processing event: the
		// database knows the lease holder. A run is looked up again at
		// most once a second, and a stream makes a few lookups a second
		// at most, so a flood of forgeries costs no more.
		e.lastRun, e.lastLookup = d.runID, time.Now()
		if c, err := schema.ConversationByKey(ctx, e.s.pool, e.user.ID, e.conv.Key); err == nil {
			e.current = c.RunID
		}
	}
	if !d.fromRun || d.runID != e.current {
		e.s.metrics.dropped.WithLabelValues(dropNotCurrentRun).Inc()
		return
	}
	e.frame(d.frame)
}

// recheck ends the stream whose token is no longer active, or whose
// conversation is gone: the deleted event may have been lost (it is
// published after the commit), and the database says for sure.
func (e *eventStream) recheck(ctx context.Context) {
	// A JWT has no token row to check (TokenID 0): its stream ends at its
	// expiry.
	if e.user.TokenID != 0 {
		if ok, err := schema.TokenActive(ctx, e.s.pool, e.user.TokenID); err == nil && !ok {
			// An inactive token is revoked or past its expiry; the
			// recheck may come before the expiry timer fires.
			if !e.user.TokenExpiresAt.IsZero() && !time.Now().Before(e.user.TokenExpiresAt) {
				e.end(endExpired)
			} else {
				e.end(endRevoked)
			}
			return
		}
	}
	if _, err := schema.ConversationByKey(ctx, e.s.pool, e.user.ID, e.conv.Key); errors.Is(err, schema.ErrNotFound) {
		e.end(endDeleted)
	}
}

// lagged ends the stream: the client reconnects with its Last-Event-ID
// and catches up from the events stream.
func (e *eventStream) lagged(context.Context) { e.close() }

func (e *eventStream) closing() { e.end(endClosing) }

// gone ends the stream: the client connects again and, its Last-Event-ID
// being from the old stream, is told to reload.
func (e *eventStream) gone() { e.close() }

func (e *eventStream) expired() { e.end(endExpired) }

// end sends the stream's final event, which says why it ends.
func (e *eventStream) end(reason string) {
	e.send("", "end", fmt.Sprintf(`{"reason":%q}`, reason))
	e.flush()
	e.close()
}
