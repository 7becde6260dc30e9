package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// client is one browser tab: it follows a conversation, keeps the id of
// the last event it got, and reconnects with it.
type client struct {
	conversation string
	lastID       string
	got          []string // message ids of the message events, in order
	ids          []uint64 // event ids, in order
}

// readUntil reads events of s until want message ids were seen in all,
// recording them.
func (c *client) readUntil(t *testing.T, s *sseStream, want int) {
	t.Helper()
	for len(c.got) < want {
		ev := s.next(t)
		if ev.Event != "" {
			continue // ready, reset: no conversation event
		}
		var ce batonnats.ConversationEvent
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &ce))
		id, err := strconv.ParseUint(ev.ID, 10, 64)
		require.NoError(t, err)
		c.ids = append(c.ids, id)
		c.got = append(c.got, ce.MessageID)
		c.lastID = ev.ID
	}
}

// TestReconnectWavesLoseAndDuplicateNothing: every stream of one API
// process drops at once and reconnects with its Last-Event-ID while
// messages keep coming, twice in a row: each client ends with every event
// of its conversation exactly once, in order. All streams share the
// process's one consumer of the events stream.
func TestReconnectWavesLoseAndDuplicateNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	tok, _, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	srv, err := api.New(api.Config{MaxStreamsPerUser: 100, MessagesPerMinute: 100000, MessageBurst: 10000}, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	b := &bundle{pool: db.Pool, srv: hs, alice: tok, client: hs.Client()}

	const conversations, shared = 20, 10
	var clients []*client
	for i := range conversations {
		id := fmt.Sprintf("c%d", i)
		b.createConversation(t, tok, id)
		clients = append(clients, &client{conversation: id})
	}
	for range shared {
		clients = append(clients, &client{conversation: "c0"}) // many tabs on one conversation
	}
	open := func(c *client) *sseStream {
		return openSSE(t, hs.URL+convPath(c.conversation, "/events"), tok, c.lastID)
	}
	streams := make([]*sseStream, len(clients))
	for i, c := range clients {
		streams[i] = open(c)
		require.Equal(t, "ready", streams[i].next(t).Event)
		c.lastID = "0" // "ready" carries the position; start from the beginning of this test's events
	}
	events, err := js.Stream(ctx, batonnats.DefaultEventsStream)
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, info.State.Consumers, "%d open streams share one consumer of the events stream", len(clients))
	posted := map[string]int{}
	post := func(round int) {
		for i := range conversations {
			id := fmt.Sprintf("c%d", i)
			r := b.do(t, tok, "POST", convPath(id, "/messages"), map[string]any{"id": fmt.Sprintf("%s-r%d", id, round), "content": "x"})
			require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
			posted[id]++
		}
	}
	post(0)
	for i, c := range clients {
		c.readUntil(t, streams[i], posted[c.conversation])
	}
	for wave := 1; wave <= 2; wave++ {
		// Every stream drops, messages arrive while they are away, and
		// every client reconnects at once with its last event id.
		for _, s := range streams {
			s.close()
		}
		post(wave)
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				streams[i] = open(c)
			}()
		}
		wg.Wait()
		post(wave + 10)
		for i, c := range clients {
			c.readUntil(t, streams[i], posted[c.conversation])
		}
	}
	for _, c := range clients {
		var want []string
		for _, round := range []int{0, 1, 11, 2, 12} {
			want = append(want, fmt.Sprintf("%s-r%d", c.conversation, round))
		}
		require.Equal(t, want, c.got, "client of %s: every event once, in order", c.conversation)
		for i := 1; i < len(c.ids); i++ {
			require.Less(t, c.ids[i-1], c.ids[i], "event ids only grow")
		}
	}
}
