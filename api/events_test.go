package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
)

type sseEvent struct {
	ID    string
	Event string
	Data  string
}

// sseStream reads server-sent events from a live response.
type sseStream struct {
	resp   *http.Response
	events chan sseEvent
	cancel context.CancelFunc
}

// close drops the connection, as a client that goes away does.
func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
	for range s.events {
	}
}

func openSSE(t *testing.T, url, token, lastID string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	s := &sseStream{resp: resp, events: make(chan sseEvent, 64), cancel: cancel}
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Data != "" {
					s.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.Event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.Data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return s
}

func (s *sseStream) next(t *testing.T) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-s.events:
		require.True(t, ok, "event stream ended")
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return sseEvent{}
}

func TestEventsStreamCommittedChangesAndResumeFromLastEventID(t *testing.T) {
	t.Parallel()
	l := startLiveAPI(t, nil, "alice")
	b, tok, hs := l.bundle, l.alice, l.srv
	b.createConversation(t, tok, "c.1 *>")
	eventsURL := hs.URL + convPath("c.1 *>", "/events")

	s := openSSE(t, eventsURL, tok, "")
	ready := s.next(t)
	require.Equal(t, "ready", ready.Event)

	require.Equal(t, http.StatusAccepted, b.do(t, tok, "POST", convPath("c.1 *>", "/messages"), map[string]any{"id": "m1", "content": "hi"}).Status)
	ev := s.next(t)
	require.NotEmpty(t, ev.ID, "state events carry ids")
	var got batonnats.ConversationEvent
	require.NoError(t, json.Unmarshal([]byte(ev.Data), &got))
	require.Equal(t, batonnats.EventMessage, got.Type)
	require.Equal(t, "m1", got.MessageID)

	// A retry of the same message commits nothing and announces nothing;
	// the next event is the second message.
	require.Equal(t, http.StatusOK, b.do(t, tok, "POST", convPath("c.1 *>", "/messages"), map[string]any{"id": "m1", "content": "hi"}).Status)
	require.Equal(t, http.StatusAccepted, b.do(t, tok, "POST", convPath("c.1 *>", "/messages"), map[string]any{"id": "m2", "content": "again"}).Status)
	ev2 := s.next(t)
	require.NoError(t, json.Unmarshal([]byte(ev2.Data), &got))
	require.Equal(t, "m2", got.MessageID)

	// Reconnecting with the first event's id resumes right after it.
	r := openSSE(t, eventsURL, tok, ev.ID)
	resumed := r.next(t)
	require.Equal(t, ev2.ID, resumed.ID)

	// Deleting the conversation is announced too.
	require.Equal(t, http.StatusNoContent, b.do(t, tok, "DELETE", convPath("c.1 *>"), nil).Status)
	del := s.next(t)
	require.NoError(t, json.Unmarshal([]byte(del.Data), &got))
	require.Equal(t, batonnats.EventDeleted, got.Type)
}

func TestEventsWithoutNATSSayHowToEnableThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	r := b.do(t, b.alice, "GET", convPath("c1", "/events"), nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	require.Contains(t, r.Raw, "--nats-url")
	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "GET", convPath("c1", "/events"), nil).Status)
}

func TestWebPageIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, "", "GET", "/", nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Contains(t, r.Raw, "<title>Baton</title>")
}

// TestAnEventsStreamMadeAnewEndsOpenStreamsAndTheirClientsAreToldToReload:
// the events stream is wiped with every other NATS file and provisioned
// again by the next publish, its sequences starting afresh. An open event
// stream ends instead of falling silent (it followed the old stream's
// position, which the new stream's events would reach only much later),
// and its client, connecting again with its Last-Event-ID, is told to
// reload, then gets the new stream's events: also when the new stream
// has gone past as many events as its Last-Event-ID counted in the old
// one (the ids of a stream made anew never name an old stream's events).
func TestAnEventsStreamMadeAnewEndsOpenStreamsAndTheirClientsAreToldToReload(t *testing.T) {
	t.Parallel()
	l := startLiveAPI(t, nil, "alice")
	b, tok, hs, ns, nc := l.bundle, l.alice, l.srv, l.ns, l.nc
	b.createConversation(t, tok, "c")
	eventsURL := hs.URL + convPath("c", "/events")
	post := func(id string) {
		t.Helper()
		require.Equal(t, http.StatusAccepted, b.do(t, tok, "POST", convPath("c", "/messages"), map[string]any{"id": id, "content": "hi"}).Status)
	}

	s := openSSE(t, eventsURL, tok, "")
	require.Equal(t, "ready", s.next(t).Event)
	var last sseEvent
	for i := range 3 {
		post("before-" + strconv.Itoa(i))
		last = s.next(t)
	}

	ns.Wipe()
	// The API provisions the stream again as it publishes this message's
	// event, numbering its events afresh.
	require.Eventually(t, nc.IsConnected, 30*time.Second, 20*time.Millisecond, "the API's NATS connection is back")
	post("after-0")
	select {
	case <-ended(s.events):
	case <-time.After(20 * time.Second):
		t.Fatal("the open stream neither ended nor got an event within 20s of the events stream being made anew")
	}

	// The new stream goes on past as many events as the old one held
	// before its client's last id: that id must not name one of its
	// events.
	for i := range 3 {
		post("after-more-" + strconv.Itoa(i))
	}

	r := openSSE(t, eventsURL, tok, last.ID)
	require.Equal(t, "reset", r.next(t).Event, "a client resuming from the old stream is told to reload, however far the new stream went")
	post("after-1")
	var got batonnats.ConversationEvent
	require.NoError(t, json.Unmarshal([]byte(r.next(t).Data), &got))
	require.Equal(t, "after-1", got.MessageID, "the new stream's events reach the client")
}

// ended is closed once the stream's events end (its connection closed),
// whatever events came before.
func ended(events chan sseEvent) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		for range events {
		}
		close(out)
	}()
	return out
}
