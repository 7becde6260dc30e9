package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kinds of load actions.
const (
	kindPlain  = "plain"
	kindBurst  = "burst"
	kindSleep  = "sleep"
	kindLookup = "lookup"
	kindNotify = "notify"
	kindFail   = "fail"
	kindRetry  = "retry"
	kindDelete = "delete"
	// kindShip calls the MCP server's ship tool, a write; kindRefund its
	// refund tool, a write that waits for approval, which the load then
	// gives, refuses or leaves to expire.
	kindShip   = "mcp_ship"
	kindRefund = "mcp_refund"
	// kindStop, in a run with agents, asks for a slow reply and stops it
	// while it streams.
	kindStop = "stop"
)

// Decisions the load takes on a refund's approval.
const (
	decideApprove = "approve"
	decideDeny    = "deny"
	decideNone    = "none" // left to expire
)

// sentMessage is what the client knows about one message it sent.
type sentMessage struct {
	conversation string
	id           string
	content      string
	kind         string

	mu sync.Mutex
	// posts counts POSTs of this ID: deliberate retries and retries after
	// a transport error or a 5xx alike.
	posts int
	// created counts 202 answers (a new turn); accepted is set by any 2xx.
	created  int
	accepted bool
	// rejected is the last non-retryable answer, such as a 404 after the
	// conversation was deleted.
	rejected string

	// decision is what the load does with a refund's approval, after
	// decideAfter.
	decision    string
	decideAfter time.Duration
	// stopAfter is when a stop message is stopped, after it was accepted.
	stopAfter time.Duration
}

// action is one step of the load: messages sent back to back into one
// conversation, maybe sent twice, maybe followed by deleting it mid-turn.
type action struct {
	at           time.Duration
	conversation string
	messages     []*sentMessage
	// retry: 0 none, 1 the same message again after the first answer, 2
	// two copies at once.
	retry       int
	deleteAfter time.Duration // > 0: delete the conversation then
}

// loadPlan is the whole load of a run, derived from the seed.
type loadPlan struct {
	conversations []string
	actions       []*action
	messages      []*sentMessage
	// agents: the workers run external agents, which the messages ask in
	// words (agentContent) instead of the echo agent's directives.
	agents bool
}

// planLoad lays out cfg.Messages messages over cfg.Conversations
// conversations and cfg.LoadDuration.
func planLoad(cfg Config, rng *rand.Rand) *loadPlan {
	p := &loadPlan{agents: len(cfg.Agents) > 0}
	for i := range cfg.Conversations {
		p.conversations = append(p.conversations, fmt.Sprintf("conv-%04d", i))
	}
	live := append([]string(nil), p.conversations...)
	deletions := max(1, cfg.Conversations/25)
	// Deletions start when the message count passes these marks.
	var deleteAt []int
	for range deletions {
		deleteAt = append(deleteAt, cfg.Messages/10+rng.IntN(cfg.Messages*8/10))
	}
	slices.Sort(deleteAt)
	n, refunds := 0, 0
	newMessage := func(conv, kind string) *sentMessage {
		id := fmt.Sprintf("msg-%05d", n)
		n++
		if p.agents {
			// The agents have no read tool, no notify and no /fail:
			// lookups become stops, notifies ships, failures plain
			// messages.
			switch kind {
			case kindLookup:
				kind = kindStop
			case kindNotify:
				kind = kindShip
			case kindFail:
				kind = kindPlain
			}
		}
		m := &sentMessage{conversation: conv, id: id, kind: kind}
		switch kind {
		case kindSleep:
			m.content = fmt.Sprintf("think about %s\n/sleep %dms", id, 50+rng.IntN(1500))
		case kindLookup:
			m.content = fmt.Sprintf("look up %s\n/tool lookup %s", id, id)
		case kindNotify:
			// The notify text is unique per message, so a side effect
			// repeated by any other run of the turn is countable.
			m.content = fmt.Sprintf("tell someone about %s\n/tool notify n-%s", id, id)
		case kindShip:
			// The argument is unique per message too, so that the MCP
			// server's record of a call names its message.
			m.content = fmt.Sprintf("ship the order of %s\n/tool %s s-%s", id, mcpShipTool, id)
		case kindRefund:
			m.content = fmt.Sprintf("refund the order of %s\n/tool %s r-%s", id, mcpRefundTool, id)
			m.decideAfter = time.Duration(200+rng.IntN(3000)) * time.Millisecond
			// In turn, so that even a short run has each: half approved,
			// a third denied, one in six left to expire (early enough
			// that it expires within the load; approved otherwise).
			m.decision = refundDecisions[refunds%len(refundDecisions)]
			if m.decision == decideNone && n >= cfg.Messages*7/10 {
				m.decision = decideApprove
			}
			refunds++
		case kindFail:
			m.content = fmt.Sprintf("this one breaks %s\n/fail", id)
		case kindDelete:
			m.content = fmt.Sprintf("a long one %s\n/sleep 2s", id)
		case kindStop:
			m.stopAfter = time.Duration(500+rng.IntN(1000)) * time.Millisecond
		default:
			m.content = fmt.Sprintf("hello from %s", id)
		}
		if p.agents {
			m.content = agentContent(kind, id)
		}
		p.messages = append(p.messages, m)
		return m
	}
	for n < cfg.Messages && len(live) > 0 {
		at := time.Duration(float64(cfg.LoadDuration) * float64(n) / float64(cfg.Messages))
		ci := rng.IntN(len(live))
		conv := live[ci]
		a := &action{at: at, conversation: conv}
		if len(deleteAt) > 0 && n >= deleteAt[0] && len(live) > 1 {
			deleteAt = deleteAt[1:]
			a.messages = []*sentMessage{newMessage(conv, kindDelete)}
			a.deleteAfter = time.Duration(100+rng.IntN(1400)) * time.Millisecond
			live = append(live[:ci], live[ci+1:]...)
			p.actions = append(p.actions, a)
			continue
		}
		switch r := rng.IntN(100); {
		case r < 44:
			a.messages = []*sentMessage{newMessage(conv, kindPlain)}
		case r < 56:
			for range 2 + rng.IntN(4) {
				a.messages = append(a.messages, newMessage(conv, kindBurst))
			}
		case r < 66:
			a.messages = []*sentMessage{newMessage(conv, kindSleep)}
		case r < 72:
			a.messages = []*sentMessage{newMessage(conv, kindLookup)}
		case r < 78:
			a.messages = []*sentMessage{newMessage(conv, kindNotify)}
		case r < 84:
			a.messages = []*sentMessage{newMessage(conv, kindShip)}
		case r < 90:
			a.messages = []*sentMessage{newMessage(conv, kindRefund)}
		case r < 92:
			a.messages = []*sentMessage{newMessage(conv, kindFail)}
		default:
			a.messages = []*sentMessage{newMessage(conv, kindRetry)}
			a.retry = 1 + rng.IntN(2)
		}
		p.actions = append(p.actions, a)
	}
	return p
}

// client talks to the API as a user would, retrying with the same message
// ID when an answer does not come.
type client struct {
	base   string
	token  string
	http   *http.Client
	budget time.Duration

	mu sync.Mutex
	// deleting are conversations the load has started to delete: a 404
	// for them is expected. deleted are those whose DELETE succeeded.
	deleting map[string]bool
	deleted  map[string]time.Time
	// errors are answers no client should get, kept for the report.
	errors []string
	// retried counts, by status, the answers that made the client send a
	// request again: 5xx and 429, and 0 for no answer at all.
	retried map[int]int

	// approvers wait for refunds' approvals and decide them; they stop
	// when stopApprovers is closed.
	approvers     sync.WaitGroup
	stopApprovers chan struct{}
	// decided are the approvals the API answered 200 to a decision, with
	// the status it said; approvals counts what the load did.
	decided   map[string]string
	approvals approvalTally
	// stops are the stops the load asked for.
	stops []stopRecord
}

// stopRecord is a stop the load asked for: sent, answered, and whether
// the API said it stopped a running turn.
type stopRecord struct {
	conversation   string
	sent, answered time.Time
	stopped        bool
}

// approvalTally counts what the load did with refunds' approvals.
type approvalTally struct {
	// Found approvals waiting; Approved and Denied got a 200; Left were
	// left to expire; Late were answered 409 approval_expired; Unseen
	// never showed (their turn failed before it asked, or its
	// conversation was deleted).
	Found, Approved, Denied, Left, Late, Unseen int
}

func newClient(base, token string) *client {
	return &client{
		base: base, token: token,
		http:     &http.Client{Timeout: 10 * time.Second},
		budget:   90 * time.Second,
		deleting: map[string]bool{},
		deleted:  map[string]time.Time{},
		retried:  map[int]int{},
		decided:  map[string]string{},

		stopApprovers: make(chan struct{}),
	}
}

// do sends one request until it gets an answer that is not a transport
// error or a 5xx, or the budget runs out. It returns the last status (0
// when no answer came) and body.
func (c *client) do(ctx context.Context, method, path string, body any, sent func()) (int, string) {
	var payload []byte
	if body != nil {
		payload, _ = json.Marshal(body)
	}
	deadline := time.Now().Add(c.budget)
	backoff := 100 * time.Millisecond
	status, text := 0, ""
	for {
		req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(payload))
		if err != nil {
			return 0, err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		if sent != nil {
			sent()
		}
		resp, err := c.http.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			status, text = resp.StatusCode, string(b)
			if status < 500 && status != http.StatusTooManyRequests {
				return status, text
			}
			c.mu.Lock()
			c.retried[status]++
			c.mu.Unlock()
		} else {
			status, text = 0, err.Error()
			if ctx.Err() == nil {
				c.mu.Lock()
				c.retried[0]++
				c.mu.Unlock()
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return status, text
		}
		select {
		case <-ctx.Done():
			return status, text
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *client) unexpected(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errors) < 50 {
		c.errors = append(c.errors, fmt.Sprintf(format, args...))
	}
}

func (c *client) createConversation(ctx context.Context, id string) error {
	status, body := c.do(ctx, http.MethodPost, "/v1/conversations", map[string]string{"id": id}, nil)
	if status != http.StatusCreated && status != http.StatusOK {
		return fmt.Errorf("create conversation %s: status %d: %s", id, status, body)
	}
	return nil
}

func (c *client) isDeleted(conv string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deleting[conv]
}

// post sends m once (with transport retries).
func (c *client) post(ctx context.Context, m *sentMessage) {
	status, body := c.do(ctx, http.MethodPost, "/v1/conversations/"+m.conversation+"/messages",
		map[string]string{"id": m.id, "content": m.content}, func() {
			m.mu.Lock()
			m.posts++
			m.mu.Unlock()
		})
	m.mu.Lock()
	defer m.mu.Unlock()
	switch status {
	case http.StatusAccepted:
		m.created++
		m.accepted = true
	case http.StatusOK:
		m.accepted = true
	default:
		m.rejected = fmt.Sprintf("%d %s", status, body)
		if status != http.StatusNotFound || !c.isDeleted(m.conversation) {
			c.unexpected("POST %s to %s: status %d: %.200s", m.id, m.conversation, status, body)
		}
	}
}

// run performs one action.
func (c *client) run(ctx context.Context, a *action) {
	if c.isDeleted(a.conversation) {
		return
	}
	for _, m := range a.messages {
		c.post(ctx, m)
	}
	for _, m := range a.messages {
		m.mu.Lock()
		accepted := m.accepted
		m.mu.Unlock()
		if m.kind == kindRefund && accepted {
			c.approvers.Go(func() { c.decide(ctx, m) })
		}
		if m.kind == kindStop && accepted {
			c.stop(ctx, m)
		}
	}
	switch a.retry {
	case 1:
		c.post(ctx, a.messages[0])
	case 2:
		var wg sync.WaitGroup
		wg.Go(func() { c.post(ctx, a.messages[0]) })
		wg.Go(func() { c.post(ctx, a.messages[0]) })
		wg.Wait()
	}
	if a.deleteAfter > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.deleteAfter):
		}
		c.mu.Lock()
		c.deleting[a.conversation] = true
		c.mu.Unlock()
		status, body := c.do(ctx, http.MethodDelete, "/v1/conversations/"+a.conversation, nil, nil)
		switch status {
		case http.StatusNoContent, http.StatusOK, http.StatusNotFound:
			c.mu.Lock()
			c.deleted[a.conversation] = time.Now()
			c.mu.Unlock()
		default:
			c.unexpected("DELETE %s: status %d: %.200s", a.conversation, status, body)
		}
	}
}

// drive runs the plan: actions at their moments, clients at once.
//
// Once the plan is sent, it keeps sending a message now and then until
// faultsDone is closed.
func (c *client) drive(ctx context.Context, p *loadPlan, clients int, faultsDone <-chan struct{}) {
	start := time.Now()
	work := make(chan *action)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for a := range work {
				c.run(ctx, a)
			}
		})
	}
	for _, a := range p.actions {
		if d := time.Until(start.Add(a.at)); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		work <- a
	}
	// Faults that fell behind the plan still need turns to hit: a worker
	// armed at a crash point dies only in a turn. A trickle of plain
	// messages runs until the faults are over.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
		case <-faultsDone:
		case <-tick.C:
			conv := p.conversations[n%len(p.conversations)]
			if c.isDeleted(conv) {
				continue
			}
			id := fmt.Sprintf("extra-%05d", n)
			m := &sentMessage{conversation: conv, id: id, kind: kindPlain, content: "still there? " + id}
			if n%4 == 3 {
				// The MCP faults wait for a call to hold or drop.
				m.kind, m.content = kindShip, fmt.Sprintf("ship the order of %s\n/tool %s s-%s", id, mcpShipTool, id)
			}
			if p.agents {
				m.content = agentContent(m.kind, id)
			}
			p.messages = append(p.messages, m)
			work <- &action{conversation: conv, messages: []*sentMessage{m}}
			continue
		}
		break
	}
	close(work)
	wg.Wait()
}

// retriedAnswers returns how many answers of each status were retried.
func (c *client) retriedAnswers() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int, len(c.retried))
	for k, v := range c.retried {
		out[k] = v
	}
	return out
}

// deletedConversations returns the conversations the client deleted.
func (c *client) deletedConversations() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]time.Time, len(c.deleted))
	for k, v := range c.deleted {
		out[k] = v
	}
	return out
}

// refundDecisions are what the load does with refunds' approvals, in turn.
var refundDecisions = []string{decideApprove, decideDeny, decideNone, decideApprove, decideDeny, decideApprove}

// approvalWait bounds how long the load looks for a refund's approval.
const approvalWait = 90 * time.Second

// decide waits for the approval the refund m asks for, then, after the
// message's delay, approves it, denies it or leaves it to expire, as
// planned, through the API, while the faults go on.
func (c *client) decide(ctx context.Context, m *sentMessage) {
	path := "/v1/conversations/" + m.conversation + "/approvals"
	want := "r-" + m.id
	deadline := time.Now().Add(approvalWait)
	id := ""
	for id == "" {
		status, body := c.do(ctx, http.MethodGet, path, nil, nil)
		switch {
		case status == http.StatusNotFound && c.isDeleted(m.conversation):
			c.tally(func(t *approvalTally) { t.Unseen++ })
			return
		case status != http.StatusOK:
			if ctx.Err() == nil {
				c.unexpected("GET %s: status %d: %.200s", path, status, body)
			}
			return
		}
		var list struct {
			Approvals []struct {
				ID        string `json:"id"`
				Status    string `json:"status"`
				Arguments struct {
					Text string `json:"text"`
				} `json:"arguments"`
			} `json:"approvals"`
		}
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			c.unexpected("GET %s: %v: %.200s", path, err, body)
			return
		}
		// Newest first: a refund asked again (its turn failed after the
		// first was decided) is decided by nobody and expires.
		for _, a := range list.Approvals {
			if a.Arguments.Text == want && a.Status == "pending" {
				id = a.ID
				break
			}
		}
		if id != "" {
			break
		}
		if time.Now().After(deadline) {
			c.tally(func(t *approvalTally) { t.Unseen++ })
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-c.stopApprovers:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
	c.tally(func(t *approvalTally) { t.Found++ })
	if m.decision == decideNone {
		c.tally(func(t *approvalTally) { t.Left++ })
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(m.decideAfter):
	}
	approve := m.decision == decideApprove
	status, body := c.do(ctx, http.MethodPost, path+"/"+id, map[string]bool{"approved": approve}, nil)
	switch {
	case status == http.StatusOK:
		var a struct {
			Status string `json:"status"`
		}
		_ = json.Unmarshal([]byte(body), &a)
		c.mu.Lock()
		c.decided[id] = a.Status
		if a.Status == "approved" {
			c.approvals.Approved++
		} else {
			c.approvals.Denied++
		}
		c.mu.Unlock()
		if wanted := map[bool]string{true: "approved", false: "denied"}[approve]; a.Status != wanted {
			c.unexpected("POST %s/%s {approved: %v}: answered 200 with status %q", path, id, approve, a.Status)
		}
	case status == http.StatusConflict && strings.Contains(body, "approval_expired"):
		c.tally(func(t *approvalTally) { t.Late++ })
	case status == http.StatusConflict && strings.Contains(body, "approval_decided"):
		// A decision whose answer was lost and sent again, or an
		// approval a claim expired first: the database says which.
	case status == http.StatusNotFound && c.isDeleted(m.conversation):
	default:
		if ctx.Err() == nil {
			c.unexpected("POST %s/%s: status %d: %.200s", path, id, status, body)
		}
	}
}

func (c *client) tally(f func(*approvalTally)) {
	c.mu.Lock()
	f(&c.approvals)
	c.mu.Unlock()
}

// endApprovals stops the approvers that still wait and returns what the
// load did, and the statuses the API answered to its decisions.
func (c *client) endApprovals() (approvalTally, map[string]string) {
	close(c.stopApprovers)
	c.approvers.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	decided := make(map[string]string, len(c.decided))
	for k, v := range c.decided {
		decided[k] = v
	}
	return c.approvals, decided
}

// agentContent is a message of the load in the words the example agents
// understand (their scripts: "call <tool> <JSON>", "think slowly").
func agentContent(kind, id string) string {
	switch kind {
	case kindSleep:
		return "think slowly about " + id
	case kindShip:
		return fmt.Sprintf(`call %s {"text":"s-%s"}`, mcpShipTool, id)
	case kindRefund:
		return fmt.Sprintf(`call %s {"text":"r-%s"}`, mcpRefundTool, id)
	case kindStop:
		return "think slowly, then be stopped: " + id
	case kindDelete:
		return "think slowly about a long one, " + id
	default:
		return "hello from " + id
	}
}

// stop stops the turn of m once it has streamed a while: POST
// /v1/conversations/{cid}/stop, whose answer says whether a turn was
// running.
func (c *client) stop(ctx context.Context, m *sentMessage) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(m.stopAfter):
	}
	sent := time.Now()
	status, body := c.do(ctx, http.MethodPost, "/v1/conversations/"+m.conversation+"/stop", nil, nil)
	answered := time.Now()
	switch {
	case status == http.StatusOK:
		var res struct {
			Stopped bool `json:"stopped"`
		}
		_ = json.Unmarshal([]byte(body), &res)
		c.mu.Lock()
		c.stops = append(c.stops, stopRecord{conversation: m.conversation, sent: sent, answered: answered, stopped: res.Stopped})
		c.mu.Unlock()
	case status == http.StatusNotFound && c.isDeleted(m.conversation):
	default:
		if ctx.Err() == nil {
			c.unexpected("POST stop of %s: status %d: %.200s", m.conversation, status, body)
		}
	}
}

// stopsAsked returns the stops the load asked for.
func (c *client) stopsAsked() []stopRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.stops)
}
