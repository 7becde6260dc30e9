package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// How a step request ended, as the recorder in front of the agent saw it.
const (
	// endOpen: it had not ended when the record was read.
	endOpen = ""
	// endAnswered: the agent's answer was passed on to its end.
	endAnswered = "answered"
	// endClosed: the worker closed the request before the agent's answer
	// ended (a Stop, a timeout, a worker that died).
	endClosed = "closed"
	// endAgentFailed: the agent could not be reached, or its answer
	// broke off (the agent died or its link was cut).
	endAgentFailed = "agent failed"
	// endHeld: a fault held it until its worker was killed; it never
	// reached the agent.
	endHeld = "held"
)

// What the journal said of a step as its request arrived.
const (
	// stepJournalAnswered: the step's answer was journaled already.
	stepJournalAnswered = "answered"
	// stepJournalReplied: the step's turn was finalized already.
	stepJournalReplied = "replied"
)

// stepRequest is one step request an agent's recorder received, as it
// arrived and as it ended.
type stepRequest struct {
	// agent is the agent's name (agentKind.name).
	agent string
	// worker sent it (by its address).
	worker string
	// runID is the body's run id, key the Idempotency-Key header.
	runID, key string
	// The step's identity as the body says it.
	conversation, turn   string
	step, epoch, attempt int
	arrived, ended       time.Time
	end                  string
	// status is the HTTP status the agent answered, 0 when none.
	status int
	// journal is what PostgreSQL said of the step as the request arrived:
	// "", stepJournalAnswered, stepJournalReplied, or journalUnread.
	journal string
	// held: a fault held it until its worker was killed.
	held bool
}

// openAt reports whether the request was open at t.
func (r stepRequest) openAt(t time.Time) bool {
	return !r.arrived.After(t) && (r.end == endOpen || r.ended.After(t))
}

// stepArm is what a fault asks of the next step request of a step
// minStep or later: hold it until release is closed. arrived receives
// the request.
type stepArm struct {
	minStep int
	arrived chan *stepRequest
	release chan struct{}
}

// stepRecorder stands in front of one agent process, on the harness's
// end of the network, as a load balancer would: the workers post their
// steps to it, and it passes each on to the agent. Every request is
// recorded as it arrives, before the agent sees it (its run id, its
// Idempotency-Key, the step it says it is, the worker that sent it, and
// whether the journal held the step answered at that moment, read from
// PostgreSQL then), and again as it ends (answered, closed by the worker,
// or the agent failed). A fault may hold the next request until its
// worker is killed.
type stepRecorder struct {
	agent string
	url   string // the recorder's origin
	srv   *http.Server
	proxy *httputil.ReverseProxy
	pool  *pgxpool.Pool

	mu       sync.Mutex
	workers  map[string]string
	requests []*stepRequest
	armed    *stepArm
	closing  chan struct{}
	done     chan struct{}
}

// startStepRecorder listens on ip, on a free port, and passes what it
// receives on to the agent at target (an origin).
func startStepRecorder(agent, ip, target string, pool *pgxpool.Pool) (*stepRecorder, error) {
	to, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("recorder of %s: %w", agent, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("recorder of %s: %w", agent, err)
	}
	r := &stepRecorder{
		agent: agent, url: "http://" + ln.Addr().String(), pool: pool,
		workers: map[string]string{}, closing: make(chan struct{}), done: make(chan struct{}),
	}
	// A transport of its own: the agent's connections must not outlive
	// the agent's process in a pool shared with anything else, and a
	// dial must not wait for a cut link longer than a worker waits.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DialContext = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	r.proxy = &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(to) },
		Transport:     transport,
		FlushInterval: -1,
		// An answer that breaks off is recorded, not printed.
		ErrorLog: log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, _ error) {
			if sr, ok := req.Context().Value(stepRequestKey{}).(*stepRequest); ok && req.Context().Err() == nil {
				r.finish(sr, endAgentFailed, 0)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
		ModifyResponse: func(res *http.Response) error {
			if sr, ok := res.Request.Context().Value(stepRequestKey{}).(*stepRequest); ok {
				r.mu.Lock()
				sr.status = res.StatusCode
				r.mu.Unlock()
			}
			return nil
		},
	}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(ln)
	}()
	return r, nil
}

type stepRequestKey struct{}

// close releases held requests and stops serving.
func (r *stepRecorder) close() {
	close(r.closing)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		_ = r.srv.Close()
	}
	<-r.done
}

// stepBody is what the recorder reads of a step request's body: AG-UI's
// runId and forwardedProps.baton, or the AI SDK's baton.
type stepBody struct {
	RunID          string       `json:"runId"`
	Baton          stepIdentity `json:"baton"`
	ForwardedProps struct {
		Baton stepIdentity `json:"baton"`
	} `json:"forwardedProps"`
}

type stepIdentity struct {
	Conversation string `json:"conversation"`
	Turn         string `json:"turn"`
	Step         int    `json:"step"`
	RunID        string `json:"runId"`
	Attempt      int    `json:"attempt"`
	Epoch        int    `json:"epoch"`
}

func (r *stepRecorder) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	if err != nil {
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	var b stepBody
	_ = json.Unmarshal(body, &b)
	id := b.Baton
	runID := id.RunID
	if b.ForwardedProps.Baton.Conversation != "" {
		id, runID = b.ForwardedProps.Baton, b.RunID
	}
	sr := &stepRequest{agent: r.agent, runID: runID, key: req.Header.Get("Idempotency-Key"),
		conversation: id.Conversation, turn: id.Turn, step: id.Step, epoch: id.Epoch, attempt: id.Attempt, arrived: time.Now()}
	sr.worker, _, _ = net.SplitHostPort(req.RemoteAddr)
	sr.journal = r.journalStatus(context.WithoutCancel(req.Context()), sr)
	r.mu.Lock()
	if name, ok := r.workers[sr.worker]; ok {
		sr.worker = name
	}
	r.requests = append(r.requests, sr)
	arm := r.armed
	if arm != nil && sr.step >= arm.minStep {
		r.armed = nil
	} else {
		arm = nil
	}
	r.mu.Unlock()
	if arm != nil {
		r.mu.Lock()
		sr.held = true
		r.mu.Unlock()
		arm.arrived <- sr
		select {
		case <-arm.release:
		case <-r.closing:
		}
		if req.Context().Err() != nil {
			// The worker is dead: the request never reaches the agent.
			r.finish(sr, endHeld, 0)
			panic(http.ErrAbortHandler)
		}
		// Another recorder's request was the one held: this one goes on.
		r.mu.Lock()
		sr.held = false
		r.mu.Unlock()
	}
	defer func() {
		if p := recover(); p != nil {
			// The agent's answer broke off after it began: the proxy
			// aborts the worker's connection, as a load balancer would.
			if req.Context().Err() != nil {
				r.finish(sr, endClosed, 0)
			} else {
				r.finish(sr, endAgentFailed, 0)
			}
			panic(p)
		}
	}()
	r.proxy.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), stepRequestKey{}, sr)))
	if req.Context().Err() != nil {
		r.finish(sr, endClosed, 0)
		return
	}
	r.finish(sr, endAnswered, 0)
}

// finish records how a request ended, once.
func (r *stepRecorder) finish(sr *stepRequest, end string, status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sr.end != endOpen {
		return
	}
	sr.end, sr.ended = end, time.Now()
	if status != 0 {
		sr.status = status
	}
}

// journalStatus reads what the journal says of the step as its request
// arrives: answered (journaled), or its turn replied (finalized). The
// worker must never post either again. PostgreSQL may be restarting or
// failing over just then: it tries for up to three seconds, then says
// journalUnread.
func (r *stepRecorder) journalStatus(ctx context.Context, sr *stepRequest) string {
	if sr.conversation == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		var answered, replied bool
		err := r.pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM agent_steps WHERE conversation_id = $1 AND turn_id = $2 AND epoch = $3 AND step = $4),
				EXISTS (SELECT 1 FROM agent_runs WHERE conversation_id = $1 AND turn_id = $2 AND status = 'finalized')`,
			sr.conversation, sr.turn, sr.epoch, sr.step).Scan(&answered, &replied)
		switch {
		case err == nil && answered:
			return stepJournalAnswered
		case err == nil && replied:
			return stepJournalReplied
		case err == nil:
			return ""
		}
		select {
		case <-ctx.Done():
			return journalUnread
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// arm makes the recorder hold the next request it receives of a step
// minStep or later, and returns the channel that receives it and the
// function that lets it go (and takes the arm back if no request came).
func (r *stepRecorder) arm(minStep int) (<-chan *stepRequest, func()) {
	a := &stepArm{minStep: minStep, arrived: make(chan *stepRequest, 1), release: make(chan struct{})}
	r.mu.Lock()
	r.armed = a
	r.mu.Unlock()
	var once sync.Once
	return a.arrived, func() {
		once.Do(func() {
			r.mu.Lock()
			if r.armed == a {
				r.armed = nil
			}
			r.mu.Unlock()
			close(a.release)
		})
	}
}

// received returns a copy of every request received so far.
func (r *stepRecorder) received() []stepRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]stepRequest, len(r.requests))
	for i, sr := range r.requests {
		out[i] = *sr
	}
	return out
}

// open counts the requests of each worker that are open now.
func (r *stepRecorder) open() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, sr := range r.requests {
		if sr.end == endOpen {
			out[sr.worker]++
		}
	}
	return out
}

// worker records the name of the worker at ip.
func (r *stepRecorder) worker(ip, name string) {
	r.mu.Lock()
	r.workers[ip] = name
	r.mu.Unlock()
}

// port is the port the recorder listens on.
func (r *stepRecorder) port() int {
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(r.url, "http://"))
	n, _ := strconv.Atoi(p)
	return n
}
