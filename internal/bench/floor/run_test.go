package floor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/bench"
)

// target is a system a run measures: Baton's stack or the floor chain,
// reached through the same routes.
type target struct {
	name   string
	client bench.Client
	// prepare readies conversations before the chats, for Baton to
	// create them.
	prepare func(tb testing.TB, conversations []string)
}

// paths are the latencies of one target's chats on the three paths.
type paths struct {
	mu sync.Mutex
	// postToModel: the client's POST to the model's request arriving.
	postToModel []time.Duration
	// modelToCommit: the model's answer ending to the client reading the
	// replied event (the reply committed and published).
	modelToCommit []time.Duration
	// tokenToChunk: a token leaving the model to the client reading the
	// live delta that carries it.
	tokenToChunk []time.Duration
}

// clock records when things happened, by key.
type clock struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newClock() *clock { return &clock{at: map[string]time.Time{}} }

func (c *clock) set(key string, at time.Time) {
	c.mu.Lock()
	c.at[key] = at
	c.mu.Unlock()
}

func (c *clock) get(key string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.at[key]
	return t, ok
}

// chats drives chats through targets against one model server, and keeps
// the time of each hop.
type chats struct {
	model                     *bench.Model
	arrived, answered, tokens *clock
}

// shape is how the model answers a chat: tokens, one every every.
type shape struct {
	tokens int
	every  time.Duration
}

func newChats(tb testing.TB) *chats {
	c := &chats{arrived: newClock(), answered: newClock(), tokens: newClock()}
	c.model = bench.NewModel(tb, func(req bench.ModelRequest) bench.ModelReply {
		// The message reads "<key> <tokens> <every>".
		var key string
		var n int
		var every time.Duration
		if _, err := fmt.Sscanf(req.LastUser(), "%s %d %d", &key, &n, &every); err != nil {
			return bench.ModelReply{Chunks: []string{"?"}}
		}
		c.arrived.set(key, req.At)
		chunks := make([]string, n)
		for i := range chunks {
			chunks[i] = fmt.Sprintf("%s.%d ", key, i)
		}
		return bench.ModelReply{Chunks: chunks, ChunkDelay: every,
			Sent: func(i int, at time.Time) { c.tokens.set(strings.TrimSpace(chunks[i]), at) },
			Done: func(at time.Time) { c.answered.set(key, at) }}
	})
	return c
}

// chat opens the conversation's events, posts one message, waits for the
// replied event and records the three paths of the turn.
func (c *chats) chat(ctx context.Context, t *target, hc *http.Client, conversation, key string, s shape, p *paths) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	type seen struct {
		token string
		at    time.Time
	}
	var (
		mu      sync.Mutex
		deltas  []seen
		replied = make(chan time.Time, 1)
	)
	client := t.client
	client.HTTP = hc
	wait, err := client.Follow(ctx, hc, conversation, func(ev bench.Event) {
		var d struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		switch {
		case ev.Name == "delta":
			mu.Lock()
			for _, tok := range strings.Fields(d.Text) {
				deltas = append(deltas, seen{tok, ev.At})
			}
			mu.Unlock()
		case ev.Name == "" && d.Type == "replied":
			select {
			case replied <- ev.At:
			default:
			}
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	defer wait()
	defer cancel()
	sent := time.Now()
	if err := client.Post(ctx, conversation, conversation+"-m", fmt.Sprintf("%s %d %d", key, s.tokens, s.every)); err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	var repliedAt time.Time
	select {
	case repliedAt = <-replied:
	case <-ctx.Done():
		return fmt.Errorf("%s: no replied event for %s within 2 minutes", t.name, key)
	}
	called, ok1 := c.arrived.get(key)
	// The model server notes the answer's end once it flushed it: the
	// replied event may be read before the note is taken.
	done, ok2 := c.answered.get(key)
	for deadline := time.Now().Add(5 * time.Second); !ok2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		done, ok2 = c.answered.get(key)
	}
	if !ok1 || !ok2 {
		return fmt.Errorf("%s: %s replied without a whole model call", t.name, key)
	}
	cancel()
	wait()
	mu.Lock()
	defer mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.postToModel = append(p.postToModel, called.Sub(sent))
	p.modelToCommit = append(p.modelToCommit, repliedAt.Sub(done))
	for _, d := range deltas {
		if at, ok := c.tokens.get(d.token); ok {
			p.tokenToChunk = append(p.tokenToChunk, d.at.Sub(at))
		}
	}
	return nil
}

// prepare has each target ready the conversations that lone (with label
// and rounds) and many (with waves and n) use.
func prepare(tb testing.TB, targets []*target, label string, rounds, waves, n int) {
	var convs []string
	for i := range rounds {
		convs = append(convs, fmt.Sprintf("%s-%d", label, i))
	}
	for w := range waves {
		for i := range n {
			convs = append(convs, fmt.Sprintf("many-%d-%d", w, i))
		}
	}
	for _, t := range targets {
		t.prepare(tb, convs)
	}
}

// lone runs rounds chats one at a time, in conversations named label-N, alternating between the targets
// (each round starts with the other one), and returns each target's paths.
func (c *chats) lone(tb testing.TB, label string, targets []*target, rounds int, s shape) map[string]*paths {
	tb.Helper()
	ctx := context.Background()
	out := map[string]*paths{}
	for _, t := range targets {
		out[t.name] = &paths{}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer hc.CloseIdleConnections()
	for i := range rounds {
		for k := range targets {
			t := targets[(i+k)%len(targets)]
			conv := fmt.Sprintf("%s-%d", label, i)
			if err := c.chat(ctx, t, hc, conv, t.name+"-"+conv, s, out[t.name]); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return out
}

// many runs waves of n chats at once per target, alternating between the
// targets; a wave's messages are posted spread evenly over spread.
func (c *chats) many(tb testing.TB, targets []*target, waves, n int, spread time.Duration, s shape) map[string]*paths {
	tb.Helper()
	ctx := context.Background()
	out := map[string]*paths{}
	for _, t := range targets {
		out[t.name] = &paths{}
	}
	for w := range waves {
		for k := range targets {
			t := targets[(w+k)%len(targets)]
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * n}}
			var wg sync.WaitGroup
			start := time.Now()
			for i := range n {
				wg.Go(func() {
					time.Sleep(time.Until(start.Add(spread * time.Duration(i) / time.Duration(n))))
					conv := fmt.Sprintf("many-%d-%d", w, i)
					if err := c.chat(ctx, t, hc, conv, fmt.Sprintf("%s-many-%d-%d", t.name, w, i), s, out[t.name]); err != nil {
						tb.Error(err)
					}
				})
			}
			wg.Wait()
			hc.CloseIdleConnections()
			if tb.Failed() {
				tb.FailNow()
			}
		}
	}
	return out
}
