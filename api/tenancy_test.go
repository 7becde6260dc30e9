package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// liveBundle is the API with NATS for live events, and two users.
func liveBundle(t *testing.T) *bundle {
	t.Helper()
	return startLiveAPI(t, nil, "alice", "bob").bundle
}

// liveAPI is an API with NATS for live events, its events stream
// provisioned, and the NATS server and connection it uses.
type liveAPI struct {
	*bundle
	ns  *testenv.NATS
	nc  *natsclient.Conn
	api *api.Server
}

// startLiveAPI starts a liveAPI with a token for each of users, made in
// their order (the first is the bundle's alice, the second its bob);
// configure, when not nil, changes the API's settings before it starts.
func startLiveAPI(t *testing.T, configure func(*api.Config), users ...string) *liveAPI {
	t.Helper()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	nc, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	b := &bundle{pool: db.Pool, natsURL: ns.URL}
	for i, name := range users {
		token, u, err := schema.CreateToken(ctx, db.Pool, name)
		require.NoError(t, err)
		switch i {
		case 0:
			b.alice, b.aliceID = token, u.ID
		case 1:
			b.bob = token
		}
	}
	var cfg api.Config
	if configure != nil {
		configure(&cfg)
	}
	srv, err := api.New(cfg, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	b.srv, b.client = hs, hs.Client()
	return &liveAPI{bundle: b, ns: ns, nc: nc, api: srv}
}

// nextEvent returns the next conversation event of s, skipping "ready".
func nextEvent(t *testing.T, s *sseStream) (sseEvent, batonnats.ConversationEvent) {
	t.Helper()
	for {
		ev := s.next(t)
		if ev.Event == "ready" {
			continue
		}
		var ce batonnats.ConversationEvent
		if ev.Event == "" {
			require.NoError(t, json.Unmarshal([]byte(ev.Data), &ce))
		}
		return ev, ce
	}
}

// TestTwoUsersWithTheSameIdsNeverSeeEachOther: two users use conversation
// "demo" and message "m1" at once; each reads and streams only their own.
// One deletes "demo" and the other creates it again: the open stream of
// the first ends on the deletion, and a replay from the start of the new
// conversation shows only its own events.
func TestTwoUsersWithTheSameIdsNeverSeeEachOther(t *testing.T) {
	t.Parallel()
	b := liveBundle(t)
	post := func(token, id, content string, want int) {
		t.Helper()
		r := b.do(t, token, "POST", convPath("demo", "/messages"), map[string]any{"id": id, "content": content})
		require.Equal(t, want, r.Status, r.Raw)
	}
	b.createConversation(t, b.alice, "demo")
	b.createConversation(t, b.bob, "demo")
	aliceStream := openSSE(t, b.srv.URL+convPath("demo", "/events"), b.alice, "")
	bobStream := openSSE(t, b.srv.URL+convPath("demo", "/events"), b.bob, "")
	require.Equal(t, "ready", aliceStream.next(t).Event)
	require.Equal(t, "ready", bobStream.next(t).Event)

	post(b.alice, "m1", "alice's secret", http.StatusAccepted)
	post(b.bob, "m1", "bob's secret", http.StatusAccepted) // same id, another owner: not a conflict
	post(b.bob, "m1", "bob's secret", http.StatusOK)       // his own retry

	_, ev := nextEvent(t, aliceStream)
	require.Equal(t, "m1", ev.MessageID)
	require.Equal(t, "demo", ev.ConversationID, "a client sees its own ids, never the server's keys")
	_, ev = nextEvent(t, bobStream)
	require.Equal(t, "m1", ev.MessageID)

	for token, want := range map[string]string{b.alice: "alice's secret", b.bob: "bob's secret"} {
		r := b.do(t, token, "GET", convPath("demo", "/messages"), nil)
		require.Equal(t, http.StatusOK, r.Status)
		msgs := r.Body["messages"].([]any)
		require.Len(t, msgs, 1, "each user has one message in their demo")
		require.Equal(t, want, msgs[0].(map[string]any)["content"])
		require.Equal(t, "m1", msgs[0].(map[string]any)["id"])
	}

	// Bob's next message is not on Alice's stream: her next event is her
	// own later message (the stream delivers a subject in order, so
	// Bob's, were it hers, would come first).
	post(b.bob, "m2", "bob again", http.StatusAccepted)
	_, ev = nextEvent(t, bobStream)
	require.Equal(t, "m2", ev.MessageID)
	post(b.alice, "m3", "alice again", http.StatusAccepted)
	_, ev = nextEvent(t, aliceStream)
	require.Equal(t, "m3", ev.MessageID)

	// Bob deletes his demo: his stream says so and ends.
	require.Equal(t, http.StatusNoContent, b.do(t, b.bob, "DELETE", convPath("demo"), nil).Status)
	_, ev = nextEvent(t, bobStream)
	require.Equal(t, batonnats.EventDeleted, ev.Type)
	end, _ := nextEvent(t, bobStream)
	require.Equal(t, "end", end.Event)
	require.JSONEq(t, `{"reason":"conversation_deleted"}`, end.Data)
	_, open := <-bobStream.events
	require.False(t, open, "the stream of a deleted conversation ends")

	// Bob creates demo again and posts; a replay from the very start shows
	// only the new conversation's events: none of his deleted demo, none of
	// Alice's.
	b.createConversation(t, b.bob, "demo")
	post(b.bob, "m1", "a new start", http.StatusAccepted)
	replay := openSSE(t, b.srv.URL+convPath("demo", "/events"), b.bob, "0")
	_, ev = nextEvent(t, replay)
	require.Equal(t, batonnats.EventMessage, ev.Type)
	require.Equal(t, "m1", ev.MessageID)
	post(b.bob, "m4", "marker", http.StatusAccepted)
	_, ev = nextEvent(t, replay)
	require.Equal(t, "m4", ev.MessageID, "nothing else was replayed before the marker")

	// And Alice's stream never saw any of it: her next event is her own.
	post(b.alice, "m5", "alice last", http.StatusAccepted)
	_, ev = nextEvent(t, aliceStream)
	require.Equal(t, "m5", ev.MessageID)
}

// TestAStreamEndsWhenItsConversationIsGoneEvenWithoutTheEvent: the deleted
// event is published after the commit and can be lost; an open stream
// checks the database again and ends anyway.
func TestAStreamEndsWhenItsConversationIsGoneEvenWithoutTheEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	tok, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	srv, err := api.New(api.Config{StreamRecheck: 100 * time.Millisecond}, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	b := &bundle{pool: db.Pool, srv: hs, alice: tok, client: hs.Client()}
	b.createConversation(t, tok, "c")
	s := openSSE(t, hs.URL+convPath("c", "/events"), tok, "")
	require.Equal(t, "ready", s.next(t).Event)

	// Deleted behind the API's back: no event is published.
	_, err = schema.DeleteConversation(ctx, db.Pool, u.ID, "c")
	require.NoError(t, err)
	end := s.next(t)
	require.Equal(t, "end", end.Event)
	require.JSONEq(t, `{"reason":"conversation_deleted"}`, end.Data)
}

// TestAStreamEndsWhenItsTokenIsRevokedOrExpires: an open event stream is
// only as good as its token: revoked, it ends at the next check; expiring,
// it ends at the expiry.
func TestAStreamEndsWhenItsTokenIsRevokedOrExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	srv, err := api.New(api.Config{StreamRecheck: 100 * time.Millisecond}, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)

	revoked, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	expiring, _, err := schema.CreateTokenUntil(ctx, db.Pool, "alice", time.Now().Add(1500*time.Millisecond))
	require.NoError(t, err)
	b := &bundle{pool: db.Pool, srv: hs, alice: revoked, client: hs.Client()}
	b.createConversation(t, revoked, "c")

	s := openSSE(t, hs.URL+convPath("c", "/events"), revoked, "")
	require.Equal(t, "ready", s.next(t).Event)
	_, err = schema.RevokeToken(ctx, db.Pool, u.TokenID)
	require.NoError(t, err)
	end := s.next(t)
	require.Equal(t, "end", end.Event)
	require.JSONEq(t, `{"reason":"token_revoked"}`, end.Data)

	e := openSSE(t, hs.URL+convPath("c", "/events"), expiring, "")
	require.Equal(t, "ready", e.next(t).Event)
	end = e.next(t)
	require.Equal(t, "end", end.Event)
	require.JSONEq(t, `{"reason":"token_expired"}`, end.Data)
}

// TestAForgedDeltaNeverReachesTheClient: a live delta is forwarded only
// from the run that holds the conversation; anything else published on
// the live subject (a forgery on an open NATS, a run that lost its lease)
// is dropped.
func TestAForgedDeltaNeverReachesTheClient(t *testing.T) {
	t.Parallel()
	b := liveBundle(t)
	ctx := context.Background()
	b.createConversation(t, b.alice, "c")
	var key string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM conversations WHERE public_id = 'c'`).Scan(&key))
	s := openSSE(t, b.srv.URL+convPath("c", "/events"), b.alice, "")
	require.Equal(t, "ready", s.next(t).Event)

	ns := b.natsURL
	nc, err := natsclient.Connect(ns)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	publish := func(subjectRun, bodyRun, text string) {
		t.Helper()
		body, err := json.Marshal(batonnats.LiveDelta{RunID: bodyRun, Seq: 1, Type: batonnats.DeltaText, Text: text})
		require.NoError(t, err)
		require.NoError(t, nc.Publish(batonnats.LiveSubject(key, subjectRun), body))
		require.NoError(t, nc.Flush())
	}
	// Nobody holds the conversation: a delta of a made-up run is dropped.
	publish("run_forged", "run_forged", "forged")
	// A run takes the lease (as a claim does); its deltas are forwarded,
	// while one whose body names another run than its subject is not.
	_, err = b.pool.Exec(ctx, `UPDATE conversations SET run_id = 'run_real', lease_expires_at = now() + interval '1 minute' WHERE id = $1`, key)
	require.NoError(t, err)
	publish("run_real", "run_forged", "mismatched")
	publish("run_forged", "run_forged", "forged again")
	publish("run_real", "run_real", "genuine")
	ev := s.next(t)
	require.Equal(t, "delta", ev.Event)
	require.Contains(t, ev.Data, "genuine", "the first delta the client sees is the real run's")
}
