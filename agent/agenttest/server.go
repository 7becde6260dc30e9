// Package agenttest is a fake OpenAI-compatible model server for tests:
// an httptest server that answers chat completion requests from a script
// (or a function of the request), streamed (server-sent events) when the
// request asks for it and whole otherwise, with the faults real servers
// have (error statuses, Retry-After, malformed bodies, streams cut, failed
// or stalled), and records what it was sent. Agent is the same for an
// external agent speaking AG-UI or the AI SDK's UI message stream.
package agenttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testenv"
)

// ToolCall is a tool call a scripted response makes.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// Response is one scripted answer.
type Response struct {
	// Status of the answer. Defaults to 200.
	Status int
	// Header is added to the answer, for example Retry-After.
	Header http.Header
	// Body, when set, is sent as is (an error body, or a malformed one),
	// instead of a completion built from the fields below, with
	// ContentType.
	Body string
	// StreamBody, when set, is sent as is as a stream of server-sent
	// events (a malformed one, say), with ContentType.
	StreamBody string
	// ContentType of a Body or StreamBody. Defaults to application/json
	// for Body and text/event-stream for StreamBody.
	ContentType string
	// Content is the reply text. Streamed, it is sent in pieces of
	// ChunkSize runes.
	Content string
	// ChunkSize is how many runes of Content one chunk holds. Defaults to 3.
	ChunkSize int
	// Reasoning is what the model thinks before it answers, sent as
	// servers that show it do, in a field the chat completions API does
	// not have: streamed in pieces of ChunkSize runes before the content,
	// in the chunks' delta; whole, in the message. The field is
	// ReasoningField, "reasoning_content" by default.
	Reasoning      string
	ReasoningField string
	// ToolCalls the model makes. Streamed, each call's arguments are sent
	// in several fragments after a first fragment with its ID and name.
	ToolCalls []ToolCall
	// OmitIndex leaves the index out of streamed tool-call fragments and
	// repeats the call's ID in each, as some servers do.
	OmitIndex bool
	// FinishReason of the choice. Defaults to "tool_calls" when there are
	// tool calls and "stop" otherwise; "-" sends none.
	FinishReason string
	// CutAfter, for a streamed answer, drops the connection after that
	// many content chunks, before the model finished.
	CutAfter int
	// ErrorAfter, for a streamed answer, sends an error event after that
	// many content chunks, as servers do when they fail mid-stream.
	ErrorAfter int
	// Hang holds the answer, headers included, until the client gives up
	// on the request.
	Hang bool
	// StallAfter, for a streamed answer, stops sending after that many
	// content chunks and holds the connection open until the client gives
	// up, as a stuck model does.
	StallAfter int
	// ChunkDelay, for a streamed answer, pauses before each content chunk,
	// as a model that writes slowly does, so that a client can watch the
	// reply grow.
	ChunkDelay time.Duration
	// ByWord, for a streamed answer, makes each content chunk one word
	// with the spaces after it, instead of ChunkSize runes.
	ByWord bool
}

// Steady is the answer of a slow model that streams steadily: words
// numbered from one ("w1 w2 w3 ..."), one chunk each, every interval, so
// that a test can stop, reload or restart things mid-reply (WaitChunks
// tells how far it got) and tell exactly which part of the reply a client
// shows.
func Steady(words int, every time.Duration) Response {
	var b strings.Builder
	for i := 1; i <= words; i++ {
		if i > 1 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%d", i)
	}
	return Response{Content: b.String(), ByWord: true, ChunkDelay: every}
}

// Message is a message of a recorded request.
type Message struct {
	Role       string `json:"role"`
	Content    any    `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// Text is the message's content as text.
func (m Message) Text() string {
	switch c := m.Content.(type) {
	case string:
		return c
	case nil:
		return ""
	default:
		b, _ := json.Marshal(c)
		return string(b)
	}
}

// Request is a recorded request.
type Request struct {
	At     time.Time
	Header http.Header
	// Bytes is the size of the request's body; Body the body.
	Bytes  int
	Body   []byte `json:"-"`
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
	// Messages are the conversation the request sent.
	Messages []Message `json:"messages"`
	// Tools are the declared tools, as sent.
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string         `json:"name"`
			Description string         `json:"description"`
			Parameters  map[string]any `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
}

// Server is a scripted model server. Its URL plus "/v1" is a base URL.
type Server struct {
	*httptest.Server
	t testing.TB

	mu       sync.Mutex
	script   []Response
	respond  Responder
	requests []Request
	count    int
	arrived  chan struct{}

	// chunks counts the content chunks sent in all; sent is signalled at
	// each.
	chunks atomic.Int64
	sent   testenv.Signal
}

// Chunks is how many content chunks the server has sent, over all
// requests.
func (s *Server) Chunks() int64 { return s.chunks.Load() }

// WaitChunks waits until the server has sent at least n content chunks in
// all, and fails t after timeout.
func (s *Server) WaitChunks(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, &s.sent, timeout, func() bool { return s.chunks.Load() >= n }, "the model to stream %d chunks (it sent %d)", n, s.chunks.Load())
}

// Responder answers request n (from 0) from what it holds.
type Responder func(n int, req Request) Response

// NewServer starts a server that answers with script, in order, and
// fails t on a request beyond it. It is closed when t ends.
func NewServer(t testing.TB, script ...Response) *Server {
	s := &Server{t: t, script: script, arrived: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

// NewResponder starts a server that answers each request with what
// respond returns for it, for tests of many requests: it keeps no
// request (Requests is empty; Count counts them), so respond checks what
// it needs to. It is closed when t ends.
func NewResponder(t testing.TB, respond Responder) *Server {
	s := &Server{t: t, respond: respond, arrived: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

// Count is the number of requests received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// BaseURL is the API root to configure an agent with.
func (s *Server) BaseURL() string { return s.URL + "/v1" }

// Add appends responses to the script.
func (s *Server) Add(rs ...Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, rs...)
}

// Requests returns what the server was sent so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Arrived receives a value for each request, as it arrives.
func (s *Server) Arrived() <-chan struct{} { return s.arrived }

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"no such endpoint"}}`, http.StatusNotFound)
		return
	}
	req := Request{At: time.Now(), Header: r.Header.Clone()}
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		s.t.Errorf("agenttest: request body is not JSON: %v", err)
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	req.Bytes, req.Body = len(body), body
	s.mu.Lock()
	n := s.count
	s.count++
	var res Response
	ok := true
	if s.respond == nil {
		s.requests = append(s.requests, req)
		ok = n < len(s.script)
		if ok {
			res = s.script[n]
		}
	}
	respond := s.respond
	s.mu.Unlock()
	if respond != nil {
		res = respond(n, req)
	} else {
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	}
	if !ok {
		s.t.Errorf("agenttest: request %d is beyond the script of %d responses", n+1, len(s.script))
		http.Error(w, `{"error":{"message":"script exhausted"}}`, http.StatusInternalServerError)
		return
	}
	if res.Hang {
		<-r.Context().Done()
		return
	}
	for k, vs := range res.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	status := res.Status
	if status == 0 {
		status = http.StatusOK
	}
	switch {
	case res.StreamBody != "":
		w.Header().Set("Content-Type", or(res.ContentType, "text/event-stream"))
		w.WriteHeader(status)
		_, _ = w.Write([]byte(res.StreamBody))
		return
	case res.Body != "" || status != http.StatusOK:
		w.Header().Set("Content-Type", or(res.ContentType, "application/json"))
		w.WriteHeader(status)
		_, _ = w.Write([]byte(res.Body))
		return
	}
	finish := res.FinishReason
	switch {
	case finish == "" && len(res.ToolCalls) > 0:
		finish = "tool_calls"
	case finish == "":
		finish = "stop"
	case finish == "-":
		finish = ""
	}
	if req.Stream {
		s.stream(w, r, res, finish)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(completion(res, finish))
}

func completion(res Response, finish string) map[string]any {
	msg := map[string]any{"role": "assistant", "content": res.Content}
	if res.Reasoning != "" {
		msg[or(res.ReasoningField, "reasoning_content")] = res.Reasoning
	}
	if len(res.ToolCalls) > 0 {
		var calls []map[string]any
		for _, c := range res.ToolCalls {
			calls = append(calls, map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}})
		}
		msg["tool_calls"] = calls
	}
	choice := map[string]any{"index": 0, "message": msg, "finish_reason": finish}
	return map[string]any{"id": "chatcmpl-test", "object": "chat.completion", "created": time.Now().Unix(), "model": "test", "choices": []any{choice}}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, res Response, finish string) {
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	send := func(delta map[string]any, finish string) {
		choice := map[string]any{"index": 0, "delta": delta, "finish_reason": nil}
		if finish != "" {
			choice["finish_reason"] = finish
		}
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": "test", "choices": []any{choice}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		flusher.Flush()
	}
	send(map[string]any{"role": "assistant", "content": ""}, "")
	size := res.ChunkSize
	if size <= 0 {
		size = 3
	}
	for _, chunk := range chunks(res.Reasoning, size, false) {
		send(map[string]any{or(res.ReasoningField, "reasoning_content"): chunk}, "")
	}
	for n, chunk := range chunks(res.Content, size, res.ByWord) {
		if res.CutAfter > 0 && n == res.CutAfter {
			panic(http.ErrAbortHandler)
		}
		if res.StallAfter > 0 && n == res.StallAfter {
			<-r.Context().Done()
			return
		}
		if res.ErrorAfter > 0 && n == res.ErrorAfter {
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"the server is overloaded\",\"type\":\"server_error\"}}\n\n")
			flusher.Flush()
			return
		}
		if res.ChunkDelay > 0 {
			select {
			case <-time.After(res.ChunkDelay):
			case <-r.Context().Done():
				return
			}
		}
		send(map[string]any{"content": chunk}, "")
		s.chunks.Add(1)
		s.sent.Notify()
	}
	for i, c := range res.ToolCalls {
		first := map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": ""}}
		if !res.OmitIndex {
			first["index"] = i
		}
		send(map[string]any{"tool_calls": []any{first}}, "")
		for _, part := range split(c.Arguments, 4) {
			frag := map[string]any{"function": map[string]any{"arguments": part}}
			if res.OmitIndex {
				frag["id"] = c.ID
			} else {
				frag["index"] = i
			}
			send(map[string]any{"tool_calls": []any{frag}}, "")
		}
	}
	send(map[string]any{}, finish)
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
}

// chunks cuts content into the pieces a stream sends: size runes each,
// or, byWord, one word with the spaces after it each.
func chunks(content string, size int, byWord bool) []string {
	var out []string
	if byWord {
		for len(content) > 0 {
			end := strings.IndexByte(strings.TrimLeft(content, " "), ' ')
			if end < 0 {
				return append(out, content)
			}
			end += len(content) - len(strings.TrimLeft(content, " "))
			for end < len(content) && content[end] == ' ' {
				end++
			}
			out, content = append(out, content[:end]), content[end:]
		}
		return out
	}
	runes := []rune(content)
	for i := 0; i < len(runes); i += size {
		out = append(out, string(runes[i:min(i+size, len(runes))]))
	}
	return out
}

func split(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// ToolMessages returns the tool results a request sent, by tool call ID.
func (r Request) ToolMessages() map[string]string {
	out := map[string]string{}
	for _, m := range r.Messages {
		if m.Role == "tool" {
			out[m.ToolCallID] = m.Text()
		}
	}
	return out
}

// LastUser returns the text of the request's last user message.
func (r Request) LastUser() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == "user" {
			return r.Messages[i].Text()
		}
	}
	return ""
}

// Roles returns the roles of the request's messages, joined by spaces.
func (r Request) Roles() string {
	roles := make([]string, len(r.Messages))
	for i, m := range r.Messages {
		roles[i] = m.Role
	}
	return strings.Join(roles, " ")
}
