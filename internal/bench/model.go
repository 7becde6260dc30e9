package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// ModelRequest is a chat completion request a Model received.
type ModelRequest struct {
	// At is when the request arrived: the start of the model call.
	At       time.Time
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string `json:"role"`
		Content any    `json:"content"`
	} `json:"messages"`
}

// LastUser is the text of the request's newest user message.
func (r ModelRequest) LastUser() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == "user" {
			if s, ok := r.Messages[i].Content.(string); ok {
				return s
			}
		}
	}
	return ""
}

// ModelReply is how a Model answers: the reply's text in chunks, streamed
// with a pause before each.
type ModelReply struct {
	Chunks     []string
	ChunkDelay time.Duration
	// Sent, when set, is called as each chunk (its index) leaves the
	// server, and Done as the answer ends, streamed answers only. Defaults
	// to none.
	Sent func(i int, at time.Time)
	Done func(at time.Time)
}

// Model is an OpenAI-compatible model server for benchmarks: it answers
// every chat completion request at once with what respond returns,
// streamed when asked to. Unlike a test's scripted server it takes
// cancelled requests (a superseded turn's) as a matter of course.
type Model struct {
	srv     *httptest.Server
	respond func(ModelRequest) ModelReply
}

// NewModel starts a model server, closed when tb ends.
func NewModel(tb testing.TB, respond func(ModelRequest) ModelReply) *Model {
	m := &Model{respond: respond}
	m.srv = httptest.NewServer(http.HandlerFunc(m.handle))
	tb.Cleanup(m.srv.Close)
	return m
}

// BaseURL is the API root to give a worker (--model-base-url).
func (m *Model) BaseURL() string { return m.srv.URL + "/v1" }

func (m *Model) handle(w http.ResponseWriter, r *http.Request) {
	req := ModelRequest{At: time.Now()}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"no such endpoint"}}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the caller gave up
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"the body is not JSON"}}`, http.StatusBadRequest)
		return
	}
	reply := m.respond(req)
	if !req.Stream {
		text := ""
		for _, c := range reply.Chunks {
			text += c
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "bench", "object": "chat.completion", "created": time.Now().Unix(), "model": "bench",
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "stop"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flusher, _ := w.(http.Flusher)
	send := func(delta map[string]any, finish any) {
		b, _ := json.Marshal(map[string]any{"id": "bench", "object": "chat.completion.chunk", "created": 1, "model": "bench",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	send(map[string]any{"role": "assistant", "content": ""}, nil)
	for i, c := range reply.Chunks {
		if reply.ChunkDelay > 0 {
			select {
			case <-time.After(reply.ChunkDelay):
			case <-r.Context().Done():
				return
			}
		}
		if reply.Sent != nil {
			reply.Sent(i, time.Now())
		}
		send(map[string]any{"content": c}, nil)
	}
	send(map[string]any{}, "stop")
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
	if reply.Done != nil {
		reply.Done(time.Now())
	}
}
