package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/batonhq/baton/jwtauth"
)

// AgentRequest is a step request an Agent received.
type AgentRequest struct {
	// At is when the request reached the agent's handler, before its body
	// was read: the start of the agent's own time.
	At time.Time
	// ThreadID is the conversation's server key, RunID the step's key.
	ThreadID, RunID string
	// Turn is the turn the step belongs to (forwardedProps.baton.turn), and
	// Step its index in the turn.
	Turn string
	Step int
	// Messages are the conversation and the turn, as AG-UI sends them.
	Messages []AgentMessage
}

// AgentMessage is a message of a step request.
type AgentMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// LastUser is the text of the request's newest user message.
func (r AgentRequest) LastUser() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == "user" {
			if s, ok := r.Messages[i].Content.(string); ok {
				return s
			}
		}
	}
	return ""
}

// AgentReply is how an Agent answers a step: an assistant's text in
// chunks, each written and flushed after a pause, between RUN_STARTED and
// RUN_FINISHED.
type AgentReply struct {
	Chunks []string
	// ChunkDelay is the pause before each chunk: the agent's own time to
	// write it.
	ChunkDelay time.Duration
	// Sent, when set, is called as each chunk (its index) has been
	// written and flushed, with how long the agent took to write it (since
	// the chunk before, or since the answer's first events). Done is
	// called as RUN_FINISHED has been flushed; Gone, instead, when the
	// agent saw its request's connection close before that (a Stop).
	// Each defaults to none.
	Sent func(i int, at time.Time, took time.Duration)
	Done func(at time.Time)
	Gone func(at time.Time)
}

// Agent is an external agent speaking AG-UI, for benchmarks: it answers
// every step request at once with what respond returns, streamed, and
// stamps what it does. Like a deployed agent, it verifies each request's
// token against the keys the API serves (Trust) and refuses the others
// with 401.
type Agent struct {
	srv     *httptest.Server
	respond func(AgentRequest) AgentReply
	keys    atomic.Pointer[jose.JSONWebKeySet]
	refused atomic.Int64

	mu             sync.Mutex
	inFlight, peak int
}

// NewAgent starts an agent, closed when tb ends.
func NewAgent(tb testing.TB, respond func(AgentRequest) AgentReply) *Agent {
	a := &Agent{respond: respond}
	a.srv = httptest.NewServer(http.HandlerFunc(a.handle))
	tb.Cleanup(a.srv.Close)
	return a
}

// URL is the agent's route (a worker's --agent-url); its origin is the
// audience of the worker's tokens.
func (a *Agent) URL() string { return a.srv.URL }

// Trust makes the agent verify every request's token against the keys
// that the API at apiURL serves at /.well-known/jwks.json (its
// --agent-public-key).
func (a *Agent) Trust(tb testing.TB, apiURL string) {
	tb.Helper()
	res, err := http.Get(apiURL + "/.well-known/jwks.json")
	if err != nil {
		tb.Fatalf("bench: read the API's agent keys: %v", err)
	}
	defer res.Body.Close()
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(res.Body).Decode(&set); err != nil || res.StatusCode != http.StatusOK || len(set.Keys) == 0 {
		tb.Fatalf("bench: the API serves no agent keys at /.well-known/jwks.json (status %d, %v): start it with --agent-public-key", res.StatusCode, err)
	}
	a.keys.Store(&set)
}

// Peak is the most step requests the agent answered at once.
func (a *Agent) Peak() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

// Refused is how many requests the agent refused for their token.
func (a *Agent) Refused() int64 { return a.refused.Load() }

// verify checks a request's bearer token as an agent does: signed by a
// key the API serves, issued by Baton, for this agent, not expired.
func (a *Agent) verify(header string) error {
	set := a.keys.Load()
	if set == nil {
		return errors.New("no keys to verify with: Trust was not called")
	}
	raw, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return errors.New("no bearer token")
	}
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return err
	}
	if len(tok.Headers) == 0 {
		return errors.New("the token has no header")
	}
	keys := set.Key(tok.Headers[0].KeyID)
	if len(keys) == 0 {
		return fmt.Errorf("no key %q", tok.Headers[0].KeyID)
	}
	var claims jwt.Claims
	if err := tok.Claims(keys[0].Key, &claims); err != nil {
		return err
	}
	return claims.Validate(jwt.Expected{Issuer: jwtauth.DefaultStepIssuer, AnyAudience: jwt.Audience{a.srv.URL}, Time: time.Now()})
}

func (a *Agent) handle(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	if r.Method != http.MethodPost {
		http.Error(w, `{"error":"POST a RunAgentInput"}`, http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the caller gave up
	}
	if err := a.verify(r.Header.Get("Authorization")); err != nil {
		a.refused.Add(1)
		http.Error(w, fmt.Sprintf(`{"error":%q}`, "token refused: "+err.Error()), http.StatusUnauthorized)
		return
	}
	var in struct {
		ThreadID       string         `json:"threadId"`
		RunID          string         `json:"runId"`
		Messages       []AgentMessage `json:"messages"`
		ForwardedProps struct {
			Baton struct {
				Turn string `json:"turn"`
				Step int    `json:"step"`
			} `json:"baton"`
		} `json:"forwardedProps"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, `{"error":"the body is not a RunAgentInput"}`, http.StatusBadRequest)
		return
	}
	req := AgentRequest{At: at, ThreadID: in.ThreadID, RunID: in.RunID, Turn: in.ForwardedProps.Baton.Turn, Step: in.ForwardedProps.Baton.Step, Messages: in.Messages}
	a.mu.Lock()
	a.inFlight++
	a.peak = max(a.peak, a.inFlight)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inFlight--
		a.mu.Unlock()
	}()
	a.answer(w, r, req, a.respond(req))
}

// answer streams reply as AG-UI events, each flushed as it is written.
func (a *Agent) answer(w http.ResponseWriter, r *http.Request, req AgentRequest, reply AgentReply) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(ev map[string]any) bool {
		b, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	gone := func() {
		if reply.Gone != nil {
			reply.Gone(time.Now())
		}
	}
	const message = "agent-reply"
	if !send(map[string]any{"type": "RUN_STARTED", "threadId": req.ThreadID, "runId": req.RunID}) ||
		!send(map[string]any{"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"}) {
		gone()
		return
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	last := time.Now()
	for i, c := range reply.Chunks {
		timer.Reset(reply.ChunkDelay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			gone()
			return
		}
		if !send(map[string]any{"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": c}) {
			gone()
			return
		}
		now := time.Now()
		if reply.Sent != nil {
			reply.Sent(i, now, now.Sub(last))
		}
		last = now
	}
	if !send(map[string]any{"type": "TEXT_MESSAGE_END", "messageId": message}) ||
		!send(map[string]any{"type": "RUN_FINISHED", "threadId": req.ThreadID, "runId": req.RunID}) {
		gone()
		return
	}
	if reply.Done != nil {
		reply.Done(time.Now())
	}
}
