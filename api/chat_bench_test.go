package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// BenchmarkChat measures what Baton adds to the latency a useChat user
// feels, through POST /v1/chat of a `baton api` process, with default
// settings, against an OpenAI-compatible model server:
//
//   - a lone message, from the POST to the model's request arriving (the
//     model answers in 150 ms; 300 lone messages to distinct chats, 50 ms
//     apart), against the same through POST
//     /v1/conversations/{cid}/messages, interleaved;
//
//   - the model's answer ending to the client reading `finish` (the reply
//     committed and read back), against the same turns' replied events
//     reaching a NATS subscriber beside the API (the commit published);
//
//   - a model's token leaving the model server to the text-delta chunk
//     that carries it read by the client, with 1 chat streaming and with
//     1,000 at once, against the same tokens' live deltas reaching a NATS
//     subscriber beside the API (the worker's publication).
//
//     go test -run '^$' -bench BenchmarkChat -benchtime 1x ./api/
func BenchmarkChat(b *testing.B) {
	for range b.N {
		chatOnce(b)
	}
}

const (
	chatLone         = 300
	chatLoneApart    = 50 * time.Millisecond
	chatAnswerIn     = 150 * time.Millisecond
	chatManyChats    = 1000
	chatTokens       = 20
	chatTokenEvery   = 100 * time.Millisecond
	chatOneTokens    = 200
	chatOneTokenEach = 20 * time.Millisecond
)

// chatClock records when things happened, by key.
type chatClock struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (c *chatClock) set(key string, at time.Time) {
	c.mu.Lock()
	c.at[key] = at
	c.mu.Unlock()
}

func (c *chatClock) get(key string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.at[key]
	return t, ok
}

func chatOnce(b *testing.B) {
	ctx := context.Background()
	bin := bench.Binary(b)
	pg := bench.StartPostgres(b, nil)
	ns := testenv.StartNATS(b)
	arrived, answered, tokens := &chatClock{at: map[string]time.Time{}}, &chatClock{at: map[string]time.Time{}}, &chatClock{at: map[string]time.Time{}}
	model := bench.NewModel(b, func(req bench.ModelRequest) bench.ModelReply {
		key := req.LastUser()
		arrived.set(key, req.At)
		if !strings.HasPrefix(key, "stream ") {
			// A lone message: the answer takes 150 ms.
			return bench.ModelReply{Chunks: []string{"ok"}, ChunkDelay: chatAnswerIn, Done: func(at time.Time) { answered.set(key, at) }}
		}
		var n int
		every := chatTokenEvery
		if _, err := fmt.Sscanf(key, "stream %d", &n); err == nil && n == 1 {
			n, every = chatOneTokens, chatOneTokenEach
		} else {
			n = chatTokens
		}
		chat := strings.TrimPrefix(key, "stream ")
		chunks := make([]string, n)
		for i := range chunks {
			chunks[i] = fmt.Sprintf("t%s.%d ", strings.ReplaceAll(chat, " ", "_"), i)
		}
		return bench.ModelReply{Chunks: chunks, ChunkDelay: every, Sent: func(i int, at time.Time) { tokens.set(strings.TrimSpace(chunks[i]), at) }}
	})
	s := bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: ns.URL,
		APIArgs: []string{"--messages-per-minute", "1000000", "--message-burst", "100000", "--max-conversations=-1",
			"--max-streams", "20000", "--max-streams-per-user", "20000"},
		WorkerArgs: []string{"--agent", "openai", "--model-base-url", model.BaseURL(), "--model", "bench", "--concurrency", "1200"}})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}}
	b.Cleanup(client.CloseIdleConnections)

	// Beside the API: the worker's live deltas and the replied events.
	nc, _ := ns.Connect(b)
	deltaSeen, repliedSeen := &chatClock{at: map[string]time.Time{}}, &chatClock{at: map[string]time.Time{}}
	if _, err := nc.Subscribe(batonnats.LivePrefix+".>", func(m *natsclient.Msg) {
		at := time.Now()
		if d, err := batonnats.ParseLiveDelta(m.Data); err == nil && d.Type == batonnats.DeltaText {
			for _, tok := range strings.Fields(d.Text) {
				deltaSeen.set(tok, at)
			}
		}
	}); err != nil {
		b.Fatal(err)
	}
	if _, err := nc.Subscribe(batonnats.DefaultEventsPrefix+".>", func(m *natsclient.Msg) {
		at := time.Now()
		var ev batonnats.ConversationEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == batonnats.EventReplied {
			repliedSeen.set(ev.MessageID, at)
		}
	}); err != nil {
		b.Fatal(err)
	}

	// post sends a chat request and reads its stream, handing each chunk
	// to onChunk with the time it was read.
	post := func(chat, id, text string, onChunk func(map[string]any, time.Time)) error {
		body, _ := json.Marshal(map[string]any{"id": chat, "trigger": "submit-message",
			"messages": []any{map[string]any{"id": id, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}}}})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.APIURL+"/v1/chat", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.Token)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("POST /v1/chat %s: %d", chat, res.StatusCode)
		}
		r := bufio.NewReader(res.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return fmt.Errorf("%s: the stream ended before [DONE]: %w", chat, err)
			}
			data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				return nil
			}
			var ch map[string]any
			if err := json.Unmarshal([]byte(data), &ch); err != nil {
				return err
			}
			onChunk(ch, time.Now())
		}
	}

	// Warm up both paths.
	for i := range 10 {
		if err := post(fmt.Sprintf("warm-%d", i), fmt.Sprintf("warm-%d", i), fmt.Sprintf("warm %d", i), func(map[string]any, time.Time) {}); err != nil {
			b.Fatal(err)
		}
		s.CreateConversation(b, fmt.Sprintf("warm-msg-%d", i))
		if err := s.Post(ctx, fmt.Sprintf("warm-msg-%d", i), fmt.Sprintf("warm-msg-%d", i), fmt.Sprintf("warm msg %d", i)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range chatLone {
		s.CreateConversation(b, fmt.Sprintf("msg-%d", i))
	}
	b.ResetTimer()

	// 1. Lone messages, the chat path and the messages path interleaved.
	var chatLat, msgLat, finishLat, repliedLat []time.Duration
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	for i := range chatLone {
		time.Sleep(time.Until(start.Add(time.Duration(i) * chatLoneApart)))
		chatKey, msgKey := fmt.Sprintf("lone chat %d", i), fmt.Sprintf("lone msg %d", i)
		wg.Go(func() {
			sent := time.Now()
			var replyID string
			var finishAt time.Time
			err := post(fmt.Sprintf("lone-%d", i), fmt.Sprintf("lone-%d", i), chatKey, func(ch map[string]any, at time.Time) {
				switch ch["type"] {
				case "start":
					replyID, _ = ch["messageId"].(string)
				case "finish":
					finishAt = at
				}
			})
			if err != nil {
				b.Error(err)
				return
			}
			call, ok1 := arrived.get(chatKey)
			done, ok2 := answered.get(chatKey)
			replied, ok3 := repliedSeen.get(replyID)
			mu.Lock()
			defer mu.Unlock()
			if ok1 {
				chatLat = append(chatLat, call.Sub(sent))
			}
			if ok2 {
				finishLat = append(finishLat, finishAt.Sub(done))
				if ok3 {
					repliedLat = append(repliedLat, replied.Sub(done))
				}
			}
		})
		wg.Go(func() {
			sent := time.Now()
			if err := s.Post(ctx, fmt.Sprintf("msg-%d", i), fmt.Sprintf("msg-%d", i), msgKey); err != nil {
				b.Error(err)
				return
			}
			for range 3000 {
				if call, ok := arrived.get(msgKey); ok {
					mu.Lock()
					msgLat = append(msgLat, call.Sub(sent))
					mu.Unlock()
					return
				}
				time.Sleep(time.Millisecond)
			}
			b.Errorf("%s: no model call within 3s", msgKey)
		})
	}
	wg.Wait()

	// 3. Tokens to chunks, with one chat and with 1,000 at once.
	tokenRun := func(chats int) (chunkLat, deltaLat []time.Duration) {
		var wg sync.WaitGroup
		for c := range chats {
			wg.Go(func() {
				chat := fmt.Sprintf("tok-%d-%d", chats, c)
				text := "stream 1"
				if chats > 1 {
					text = fmt.Sprintf("stream %d-%d", chats, c)
				}
				var got []struct {
					tok string
					at  time.Time
				}
				err := post(chat, chat, text, func(ch map[string]any, at time.Time) {
					if ch["type"] == "text-delta" {
						for _, tok := range strings.Fields(ch["delta"].(string)) {
							got = append(got, struct {
								tok string
								at  time.Time
							}{tok, at})
						}
					}
				})
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for _, g := range got {
					if sent, ok := tokens.get(g.tok); ok {
						chunkLat = append(chunkLat, g.at.Sub(sent))
						if seen, ok := deltaSeen.get(g.tok); ok {
							deltaLat = append(deltaLat, seen.Sub(sent))
						}
					}
				}
			})
		}
		wg.Wait()
		return chunkLat, deltaLat
	}
	oneChunk, oneDelta := tokenRun(1)
	manyChunk, manyDelta := tokenRun(chatManyChats)
	b.StopTimer()

	p := bench.Percentile
	fig := func(id, name string, v, ref []time.Duration, refName string, pct float64, aim string, met func(time.Duration) bool) {
		val, r := p(v, pct), p(ref, pct)
		f := bench.Figure{ID: id, Name: name, Value: bench.Ms(val), Reference: bench.Ms(r) + " " + refName}
		if r > 0 {
			f.Ratio = float64(val) / float64(r)
		}
		if aim != "" {
			f.Aim, f.Met = aim, bench.Verdict(met(val))
		}
		bench.Record(b, f)
	}
	under := func(d time.Duration) func(time.Duration) bool { return func(v time.Duration) bool { return v < d } }
	fig("8a", fmt.Sprintf("chat: lone message, POST /v1/chat to the model's request, p50 (%d messages %s apart, model answers in %s)", len(chatLat), chatLoneApart, chatAnswerIn),
		chatLat, msgLat, "through POST /messages", 50, "", nil)
	fig("8b", "same, p99", chatLat, msgLat, "through POST /messages", 99, "under 10 ms", under(10*time.Millisecond))
	fig("8c", fmt.Sprintf("chat: the model's answer to finish read by the client, p50 (%d turns)", len(finishLat)),
		finishLat, repliedLat, "to the replied event on NATS", 50, "", nil)
	fig("8d", "same, p99", finishLat, repliedLat, "to the replied event on NATS", 99, "under 10 ms", under(10*time.Millisecond))
	fig("8e", fmt.Sprintf("chat: a token to its text-delta chunk, 1 chat, p50 (%d tokens)", len(oneChunk)), oneChunk, oneDelta, "to the live delta on NATS", 50, "", nil)
	fig("8f", "same, p99", oneChunk, oneDelta, "to the live delta on NATS", 99, "", nil)
	fig("8g", fmt.Sprintf("chat: a token to its text-delta chunk, %d chats at once, p50 (%d tokens)", chatManyChats, len(manyChunk)), manyChunk, manyDelta, "to the live delta on NATS", 50, "", nil)
	fig("8h", "same, p99", manyChunk, manyDelta, "to the live delta on NATS", 99, "under 20 ms", under(20*time.Millisecond))
	if want := chatManyChats * chatTokens; len(manyChunk) != want {
		b.Errorf("%d of %d tokens reached their clients", len(manyChunk), want)
	}
}
