package agenttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testenv"
)

// AgentReply is one scripted answer of an external agent (AG-UI or the AI
// SDK's UI message stream): a status, and frames sent as server-sent
// events, with the faults real agents have.
type AgentReply struct {
	// Status of the answer. Defaults to 200.
	Status int
	// Header is added to the answer, for example Retry-After.
	Header http.Header
	// ContentType of the answer. Defaults to text/event-stream.
	ContentType string
	// Body, when set, is sent as is instead of Frames (an error body, or
	// something that is not server-sent events).
	Body string
	// Frames are sent in order, each as one event: "data: <frame>".
	Frames []string
	// FirstByteDelay holds the body (the headers are sent at once) before
	// the first frame.
	FirstByteDelay time.Duration
	// FrameDelay pauses before each frame after the first.
	FrameDelay time.Duration
	// CutAfter drops the connection after that many frames.
	CutAfter int
	// StallAfter stops sending after that many frames and holds the
	// connection open until the client goes away.
	StallAfter int
	// Hang holds the answer, headers included, until the client goes
	// away.
	Hang bool
}

// AgentRequest is a request an Agent received.
type AgentRequest struct {
	Header http.Header
	Body   json.RawMessage
}

// Decode decodes the request's body into v, failing t when it cannot.
func (r AgentRequest) Decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("agenttest: the request body does not decode: %v", err)
	}
}

// Map is the request's body as JSON values.
func (r AgentRequest) Map(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	r.Decode(t, &m)
	return m
}

// AgentResponder answers request n (from 0).
type AgentResponder func(n int, req AgentRequest) AgentReply

// Agent is a scripted external agent served over HTTP at its URL. It
// records what it was sent and tells when a client went away before its
// answer ended.
type Agent struct {
	*httptest.Server
	t testing.TB

	mu       sync.Mutex
	script   []AgentReply
	respond  AgentResponder
	requests []AgentRequest
	inFlight int
	peak     int
	arrived  chan struct{}
	gone     chan struct{}
	// sent counts the frames sent; frames is signalled at each.
	sent   int
	frames testenv.Signal
}

// NewAgent starts an agent that answers with script, in order, and fails
// t on a request beyond it. It is closed when t ends.
func NewAgent(t testing.TB, script ...AgentReply) *Agent {
	return startAgent(t, httptest.NewServer, script, nil)
}

// NewTLSAgent starts an agent like NewAgent, served over https with a
// certificate of its own (Certificate).
func NewTLSAgent(t testing.TB, script ...AgentReply) *Agent {
	return startAgent(t, httptest.NewTLSServer, script, nil)
}

// NewAgentResponder starts an agent that answers each request with what
// respond returns for it. It is closed when t ends.
func NewAgentResponder(t testing.TB, respond AgentResponder) *Agent {
	return startAgent(t, httptest.NewServer, nil, respond)
}

func startAgent(t testing.TB, serve func(http.Handler) *httptest.Server, script []AgentReply, respond AgentResponder) *Agent {
	a := &Agent{t: t, script: script, respond: respond, arrived: make(chan struct{}, 1024), gone: make(chan struct{}, 1024)}
	a.Server = serve(http.HandlerFunc(a.handle))
	t.Cleanup(a.Close)
	return a
}

// Requests returns what the agent was sent so far.
func (a *Agent) Requests() []AgentRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AgentRequest(nil), a.requests...)
}

// Peak is the most requests the agent answered at once.
func (a *Agent) Peak() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

// Arrived receives a value for each request, as it arrives.
func (a *Agent) Arrived() <-chan struct{} { return a.arrived }

// Gone receives a value for each request whose client went away before
// its answer ended (an aborted request), as the agent sees it.
func (a *Agent) Gone() <-chan struct{} { return a.gone }

// WaitFrames waits until the agent has sent at least n frames in all, and
// fails t after timeout.
func (a *Agent) WaitFrames(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, &a.frames, timeout, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.sent >= n
	}, "the agent to send %d frames", n)
}

func (a *Agent) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || !json.Valid(body) {
		a.t.Errorf("agenttest: the request body is not JSON (%v): %q", err, body)
		http.Error(w, `{"error":"bad json"}`, http.StatusBadRequest)
		return
	}
	req := AgentRequest{Header: r.Header.Clone(), Body: body}
	a.mu.Lock()
	n := len(a.requests)
	a.requests = append(a.requests, req)
	a.inFlight++
	a.peak = max(a.peak, a.inFlight)
	respond := a.respond
	var reply AgentReply
	ok := true
	if respond == nil {
		ok = n < len(a.script)
		if ok {
			reply = a.script[n]
		}
	}
	a.mu.Unlock()
	// A request stops counting as in flight before the last of its
	// answer goes out: its client may end it and send the next one
	// before this handler returns.
	var once sync.Once
	finish := func() {
		once.Do(func() {
			a.mu.Lock()
			a.inFlight--
			a.mu.Unlock()
		})
	}
	defer finish()
	select {
	case a.arrived <- struct{}{}:
	default:
	}
	if respond != nil {
		reply = respond(n, req)
	}
	if !ok {
		a.t.Errorf("agenttest: request %d is beyond the script of %d replies", n+1, len(a.script))
		http.Error(w, `{"error":"script exhausted"}`, http.StatusInternalServerError)
		return
	}
	a.answer(w, r, reply, finish)
}

// left reports the client's going away, and whether it went.
func (a *Agent) left(r *http.Request, d time.Duration) bool {
	var after <-chan time.Time
	if d >= 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		after = timer.C
	}
	select {
	case <-r.Context().Done():
		a.gone <- struct{}{}
		return true
	case <-after:
		return false
	}
}

func (a *Agent) answer(w http.ResponseWriter, r *http.Request, reply AgentReply, finish func()) {
	if reply.Hang {
		a.left(r, -1)
		return
	}
	for k, vs := range reply.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	contentType := reply.ContentType
	if contentType == "" {
		contentType = "text/event-stream"
		if reply.Body != "" && status != http.StatusOK {
			contentType = "application/json"
		}
	}
	w.Header().Set("Content-Type", contentType)
	if reply.Body != "" || status != http.StatusOK {
		// The client may be done once it has the status.
		finish()
	}
	w.WriteHeader(status)
	flusher := w.(http.Flusher)
	flusher.Flush()
	if reply.Body != "" {
		_, _ = io.WriteString(w, reply.Body)
		return
	}
	if reply.FirstByteDelay > 0 && a.left(r, reply.FirstByteDelay) {
		return
	}
	for n, frame := range reply.Frames {
		switch {
		case reply.CutAfter > 0 && n == reply.CutAfter:
			panic(http.ErrAbortHandler)
		case reply.StallAfter > 0 && n == reply.StallAfter:
			a.left(r, -1)
			return
		case n > 0 && reply.FrameDelay > 0 && a.left(r, reply.FrameDelay):
			return
		}
		if n == len(reply.Frames)-1 {
			finish()
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", frame); err != nil {
			return
		}
		flusher.Flush()
		a.mu.Lock()
		a.sent++
		a.mu.Unlock()
		a.frames.Notify()
	}
}

// JSON is v as one frame.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Frames joins lists of frames.
func Frames(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// pieces cuts s into pieces of size bytes (runes kept whole).
func pieces(s string, size int) []string {
	if size <= 0 {
		size = 3
	}
	var out []string
	r := []rune(s)
	for i := 0; i < len(r); i += size {
		out = append(out, string(r[i:min(i+size, len(r))]))
	}
	return out
}

type ev = map[string]any

// AGUIRun is an AG-UI run: RUN_STARTED, the events, RUN_FINISHED.
func AGUIRun(events ...[]string) []string {
	out := []string{JSON(ev{"type": "RUN_STARTED", "threadId": "t", "runId": "r"})}
	out = append(out, Frames(events...)...)
	return append(out, JSON(ev{"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}))
}

// AGUIText is an assistant's text message as TEXT_MESSAGE_START, CONTENT
// (size runes each) and END.
func AGUIText(messageID, text string, size int) []string {
	out := []string{JSON(ev{"type": "TEXT_MESSAGE_START", "messageId": messageID, "role": "assistant"})}
	for _, p := range pieces(text, size) {
		out = append(out, JSON(ev{"type": "TEXT_MESSAGE_CONTENT", "messageId": messageID, "delta": p}))
	}
	return append(out, JSON(ev{"type": "TEXT_MESSAGE_END", "messageId": messageID}))
}

// AGUITextChunks is an assistant's text message as TEXT_MESSAGE_CHUNK
// events alone, as Mastra sends it.
func AGUITextChunks(messageID, text string, size int) []string {
	var out []string
	for _, p := range pieces(text, size) {
		out = append(out, JSON(ev{"type": "TEXT_MESSAGE_CHUNK", "role": "assistant", "messageId": messageID, "delta": p}))
	}
	return out
}

// AGUIToolCall is a tool call as TOOL_CALL_START, ARGS (in pieces) and
// END.
func AGUIToolCall(id, name, args string) []string {
	out := []string{JSON(ev{"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": name, "parentMessageId": "m"})}
	for _, p := range pieces(args, 5) {
		out = append(out, JSON(ev{"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": p}))
	}
	return append(out, JSON(ev{"type": "TOOL_CALL_END", "toolCallId": id}))
}

// AGUIToolResult is the result of a tool the agent ran itself.
func AGUIToolResult(id, content string) []string {
	return []string{JSON(ev{"type": "TOOL_CALL_RESULT", "messageId": id + "-r", "toolCallId": id, "content": content, "role": "tool"})}
}

// AGUIRunError is a RUN_ERROR event.
func AGUIRunError(message string) string {
	return JSON(ev{"type": "RUN_ERROR", "message": message})
}

// AGUIRaw is a RAW event whose payload is about size bytes, as LangGraph
// sends many of.
func AGUIRaw(size int) string {
	return JSON(ev{"type": "RAW", "event": ev{"data": strings.Repeat("x", size)}})
}

// UIStream is a UI message stream: start, start-step, the chunks,
// finish-step, finish and [DONE].
func UIStream(chunks ...[]string) []string {
	out := []string{JSON(ev{"type": "start", "messageId": "msg-agent"}), JSON(ev{"type": "start-step"})}
	out = append(out, Frames(chunks...)...)
	return append(out, JSON(ev{"type": "finish-step"}), JSON(ev{"type": "finish"}), "[DONE]")
}

// UIText is a text part: text-start, text-delta (size runes each),
// text-end.
func UIText(id, text string, size int) []string {
	out := []string{JSON(ev{"type": "text-start", "id": id})}
	for _, p := range pieces(text, size) {
		out = append(out, JSON(ev{"type": "text-delta", "id": id, "delta": p}))
	}
	return append(out, JSON(ev{"type": "text-end", "id": id}))
}

// UIToolCall is a tool call whose input streams: tool-input-start,
// tool-input-delta (in pieces), tool-input-available with the input
// parsed.
func UIToolCall(id, name, input string) []string {
	out := []string{JSON(ev{"type": "tool-input-start", "toolCallId": id, "toolName": name, "dynamic": true})}
	for _, p := range pieces(input, 5) {
		out = append(out, JSON(ev{"type": "tool-input-delta", "toolCallId": id, "inputTextDelta": p}))
	}
	return append(out, JSON(ev{"type": "tool-input-available", "toolCallId": id, "toolName": name, "input": json.RawMessage(input), "dynamic": true}))
}

// UIToolOutput is the output of a tool the agent ran itself.
func UIToolOutput(id, output string) []string {
	return []string{JSON(ev{"type": "tool-output-available", "toolCallId": id, "output": output})}
}
