package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// sseHeartbeat keeps idle event streams alive through proxies and lets a
// client notice a dead connection.
const sseHeartbeat = 15 * time.Second

// maxRunLookups is how many times a second an event stream may ask the
// database which run holds its conversation.
const maxRunLookups = 5

// DefaultStreamRecheck is how often an open event stream checks again
// that its conversation still exists and is still its user's.
const DefaultStreamRecheck = 30 * time.Second

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
	user := userFrom(r.Context())
	conv, err := schema.GetConversation(r.Context(), s.pool, user.ID, cid)
	if err != nil {
		if errors.Is(err, schema.ErrNotFound) {
			s.notFound(w, cid)
		} else {
			s.internalError(w, r, err)
		}
		return
	}
	release, err := s.acquireStream(userFrom(r.Context()).ID)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	defer release()
	if s.cfg.JetStream == nil {
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events need NATS: start the API with --nats-url / BATON_NATS_URL")
		return
	}
	rc := http.NewResponseController(w)
	ctx := r.Context()
	if err := s.hub.start(); err != nil {
		s.log.Warn().Err(err).Msg("cannot follow the events stream")
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events are not available right now; try again shortly")
		return
	}
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = r.URL.Query().Get("last_event_id")
	}
	resumeFrom := uint64(0)
	if lastID != "" {
		n, err := strconv.ParseUint(lastID, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_last_event_id", "Last-Event-ID must be the id of an event this endpoint sent")
			return
		}
		resumeFrom = n + 1
	}
	// Registered before anything is read, so that nothing published from
	// now on is missed: the hub hands this stream every event after
	// position, and what the client missed before it is read from the
	// stream (catch-up).
	l, position := s.hub.listen(conv.Key)
	defer s.hub.forget(conv.Key, l)
	first, sent := "ready", position
	if resumeFrom > 0 {
		firstSeq, lastSeq, err := s.hub.bounds(ctx)
		switch {
		case err != nil:
			s.log.Warn().Err(err).Msg("read the events stream's bounds")
			writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events are not available right now; try again shortly")
			return
		case resumeFrom-1 > lastSeq:
			// From another stream (reset or recreated): reload.
			first = "reset"
		case resumeFrom < firstSeq:
			// What came after the client's event is gone from retention:
			// reload.
			first = "reset"
		default:
			first, sent = "", resumeFrom-1
		}
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if first != "" {
		id := strconv.FormatUint(position, 10)
		if err := writeSSE(w, id, first, fmt.Sprintf(`{"last_event_id":%s}`, id)); err != nil {
			return
		}
	} else {
		// Confirm the connection at once so that the client knows it is
		// live even when nothing happens for a while.
		fmt.Fprint(w, ": resumed\n\n")
	}
	_ = rc.Flush()

	tick := time.NewTicker(sseHeartbeat)
	defer tick.Stop()
	recheck := time.NewTicker(s.cfg.StreamRecheck)
	defer recheck.Stop()
	// A token that expires ends the stream at that moment, not at the
	// next check.
	var expired <-chan time.Time
	if !user.TokenExpiresAt.IsZero() {
		t := time.NewTimer(time.Until(user.TokenExpiresAt))
		defer t.Stop()
		expired = t.C
	}
	// Live deltas are forwarded only from the run that holds the
	// conversation, as the database and the conversation events say: a
	// delta anyone else publishes on the live subject never reaches the
	// client.
	current := conv.RunID
	lookups := rate.NewLimiter(rate.Limit(maxRunLookups), maxRunLookups)
	var lastRun string
	var lastLookup time.Time
	end := func(reason string) {
		_ = writeSSE(w, "", "end", fmt.Sprintf(`{"reason":%q}`, reason))
		_ = rc.Flush()
	}
	// errEnded stops the stream after its final event.
	errEnded := errors.New("stream ended")
	deliver := func(e hubEvent) error {
		if e.seq <= sent {
			return nil // sent already (catch-up and the hub overlap)
		}
		sent = e.seq
		var ev batonnats.ConversationEvent
		if json.Unmarshal(e.data, &ev) != nil {
			return nil
		}
		if ev.At.Before(conv.CreatedAt) {
			// Never anything from before the conversation existed.
			return nil
		}
		switch ev.Type {
		case batonnats.EventProcessing:
			current = ev.RunID
		case batonnats.EventReplied, batonnats.EventFailed, batonnats.EventPending, batonnats.EventWaiting, batonnats.EventCancelled, batonnats.EventWaitingForApproval:
			if ev.RunID == current {
				current = ""
			}
		}
		// The client knows the conversation by its own id.
		ev.ConversationID = cid
		body, _ := json.Marshal(ev)
		if err := writeSSE(w, strconv.FormatUint(e.seq, 10), "", string(body)); err != nil {
			return err
		}
		if ev.Type == batonnats.EventDeleted {
			end(endDeleted)
			return errEnded
		}
		return nil
	}
	sendDelta := func(d *liveDelta) error {
		if d.fromRun && d.runID != current && (d.runID != lastRun || time.Since(lastLookup) > time.Second) && lookups.Allow() {
			// The delta may have overtaken the processing event: the
			// database knows the lease holder. A run is looked up again
			// at most once a second, and a stream makes a few lookups a
			// second at most, so a flood of forgeries costs no more.
			lastRun, lastLookup = d.runID, time.Now()
			if c, cerr := schema.ConversationByKey(ctx, s.pool, user.ID, conv.Key); cerr == nil {
				current = c.RunID
			}
		}
		if !d.fromRun || d.runID != current {
			s.metrics.dropped.WithLabelValues(dropNotCurrentRun).Inc()
			return nil
		}
		_, err := w.Write(d.frame)
		return err
	}
	// drain writes what else is already waiting, so that one flush sends
	// it all: a busy conversation costs a write per burst, not per event.
	drain := func() error {
		for range listenerEvents + listenerDeltas {
			select {
			case e := <-l.events:
				if err := deliver(e); err != nil {
					return err
				}
			case d := <-l.deltas:
				if err := sendDelta(d); err != nil {
					return err
				}
			default:
				return nil
			}
		}
		return nil
	}
	if first == "" && sent < position {
		if err := s.hub.catchUp(ctx, s.eventsCfg.Subject(conv.Key), sent+1, position, deliver); err != nil {
			if !errors.Is(err, errEnded) && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("catch up an event stream")
			}
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-s.closing:
			end(endClosing)
			return
		case <-l.gone:
			// The events stream was made anew: the client connects
			// again and, its Last-Event-ID being from the old stream,
			// is told to reload.
			return
		case e := <-l.events:
			if err := deliver(e); err != nil {
				return
			}
		case d := <-l.deltas:
			err = sendDelta(d)
		case <-tick.C:
			if l.lagging.Load() {
				// Events were dropped for this slow client: it reconnects
				// with its Last-Event-ID and catches up from the stream.
				return
			}
			_, err = fmt.Fprint(w, ": keep-alive\n\n")
		case <-expired:
			end(endExpired)
			return
		case <-recheck.C:
			// A JWT has no token row to check (TokenID 0): its stream
			// ends at its expiry.
			if user.TokenID != 0 {
				if ok, terr := schema.TokenActive(ctx, s.pool, user.TokenID); terr == nil && !ok {
					// An inactive token is revoked or past its expiry;
					// the recheck may come before the expiry timer fires.
					if !user.TokenExpiresAt.IsZero() && !time.Now().Before(user.TokenExpiresAt) {
						end(endExpired)
					} else {
						end(endRevoked)
					}
					return
				}
			}
			// The deleted event may have been lost (it is published after
			// the commit); the database says for sure.
			if _, cerr := schema.ConversationByKey(ctx, s.pool, user.ID, conv.Key); errors.Is(cerr, schema.ErrNotFound) {
				end(endDeleted)
				return
			}
		}
		if err == nil {
			err = drain()
		}
		if err != nil {
			return
		}
		if l.lagging.Load() {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// writeSSE writes one event. data must not contain newlines (JSON here).
func writeSSE(w http.ResponseWriter, id, event, data string) error {
	_, err := w.Write(sseFrame(id, event, data))
	return err
}

// sseFrame is one event in the text/event-stream format.
func sseFrame(id, event, data string) []byte {
	var b bytes.Buffer
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	if event != "" {
		b.WriteString("event: " + event + "\n")
	}
	b.WriteString("data: " + strings.ReplaceAll(data, "\n", "") + "\n\n")
	return b.Bytes()
}
