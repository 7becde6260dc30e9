package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The run's MCP server as the workers know it, and its two tools. Both are
// writes (the server is not trusted, so no annotation could make them
// reads); refund waits for a person's approval.
const (
	mcpName       = "chaos"
	mcpShip       = "ship"
	mcpRefund     = "refund"
	mcpShipTool   = mcpName + "__" + mcpShip
	mcpRefundTool = mcpName + "__" + mcpRefund
	// approvalTTL is how long the workers let a refund wait for its
	// approval: short, so that the approvals the load leaves undecided
	// expire within the run.
	approvalTTL = 10 * time.Second
	// mcpMaxHold is the longest a call is held before it is answered, by
	// chance; a fault holds one until its worker is dead.
	mcpMaxHold = 800 * time.Millisecond
)

// journalUnread is a call's journal status when PostgreSQL could not be
// read as it arrived: the verdict judges it by the time its operation
// was started instead.
const journalUnread = "?"

// mcpCall is one tools/call the server received, as it arrived.
type mcpCall struct {
	tool string // ship or refund
	// text is the call's argument, unique to the message that made it.
	text string
	// metaKey is the idempotency key of the request's _meta, headerKey
	// the one of its Idempotency-Key header.
	metaKey, headerKey string
	// worker sent it (by its address).
	worker string
	// arrived is when the request was read; answered when the SDK's
	// answer was written (or the connection dropped).
	arrived, answered time.Time
	// journal is the status of the operation with the call's key in
	// PostgreSQL when the call arrived: "" when there was none,
	// journalUnread when it could not be read.
	journal string
	// dropped: a fault dropped the connection instead of answering.
	dropped bool
	// held: a fault held it until its worker was killed.
	held bool
}

// mcpArm is what a fault asks of the next call: hold it until release is
// closed, or drop its connection. arrived receives the call.
type mcpArm struct {
	drop    bool
	arrived chan *mcpCall
	release chan struct{}
}

// mcpServer is the run's MCP server: the Go SDK over Streamable HTTP, in
// the harness's namespace, on the address PostgreSQL listens on for the
// processes. In front of the SDK, every tools/call is recorded as it
// arrives, before anything answers it: its idempotency keys (_meta and
// header), the worker that sent it, and whether the worker's journal held
// it as started at that moment (read from PostgreSQL then). A call is held
// for a random moment before it is answered, so that kills find calls in
// flight; faults hold one until its worker is killed, or drop one's
// connection.
type mcpServer struct {
	url  string
	srv  *http.Server
	pool *pgxpool.Pool

	mu sync.Mutex
	// workers names the worker at each address.
	workers map[string]string
	rng     *rand.Rand
	calls   []*mcpCall
	armed   *mcpArm
	// closing releases held calls when the run ends.
	closing chan struct{}
	done    chan struct{}
}

// startMCPServer listens on ip, on a free port.
func startMCPServer(ip string, pool *pgxpool.Pool, seed int64) (*mcpServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("MCP server: %w", err)
	}
	m := &mcpServer{
		url:     "http://" + ln.Addr().String() + "/mcp",
		pool:    pool,
		workers: map[string]string{},
		rng:     rand.New(rand.NewPCG(uint64(seed), 3)),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m.server() },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	m.srv = &http.Server{Handler: m.handler(sdk), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(ln)
	}()
	return m, nil
}

// close releases held calls and stops serving.
func (m *mcpServer) close() {
	close(m.closing)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.srv.Shutdown(ctx); err != nil {
		_ = m.srv.Close()
	}
	<-m.done
}

// server is the SDK's server with the two tools. They only answer: the
// recording is done in front of them (handler), where the request's
// header and address are known.
func (m *mcpServer) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "chaos", Version: "1"}, nil)
	schema := map[string]any{
		"type":       "object",
		"properties": map[string]any{"text": map[string]any{"type": "string"}},
		"required":   []string{"text"},
	}
	answer := func(verb string) mcp.ToolHandler {
		return func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct {
				Text string `json:"text"`
			}
			_ = json.Unmarshal(req.Params.Arguments, &args)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: verb + " " + args.Text}}}, nil
		}
	}
	s.AddTool(&mcp.Tool{Name: mcpShip, Description: "Ships an order: a side effect, recorded per idempotency key.", InputSchema: schema}, answer("shipped"))
	s.AddTool(&mcp.Tool{Name: mcpRefund, Description: "Refunds an order: a side effect that waits for approval.", InputSchema: schema}, answer("refunded"))
	return s
}

// rpcCall is what the server reads of a tools/call request.
type rpcCall struct {
	Method string `json:"method"`
	Params struct {
		Name      string `json:"name"`
		Arguments struct {
			Text string `json:"text"`
		} `json:"arguments"`
		Meta map[string]any `json:"_meta"`
	} `json:"params"`
}

func (m *mcpServer) handler(sdk http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read the request", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var rc rpcCall
		if json.Unmarshal(body, &rc) != nil || rc.Method != "tools/call" {
			sdk.ServeHTTP(w, r)
			return
		}
		c := &mcpCall{tool: rc.Params.Name, text: rc.Params.Arguments.Text, headerKey: r.Header.Get("Idempotency-Key"), arrived: time.Now()}
		c.metaKey, _ = rc.Params.Meta["idempotencyKey"].(string)
		c.worker, _, _ = net.SplitHostPort(r.RemoteAddr)
		c.journal = m.journalStatus(context.WithoutCancel(r.Context()), c.metaKey)
		m.mu.Lock()
		if name, ok := m.workers[c.worker]; ok {
			c.worker = name
		}
		m.calls = append(m.calls, c)
		arm := m.armed
		m.armed = nil
		hold := time.Duration(m.rng.Int64N(int64(mcpMaxHold)))
		m.mu.Unlock()
		answered := func() {
			m.mu.Lock()
			c.answered = time.Now()
			m.mu.Unlock()
		}
		switch {
		case arm != nil && arm.drop:
			m.mu.Lock()
			c.dropped = true
			m.mu.Unlock()
			answered()
			arm.arrived <- c
			// The request arrived; its connection ends without an answer.
			panic(http.ErrAbortHandler)
		case arm != nil:
			m.mu.Lock()
			c.held = true
			m.mu.Unlock()
			arm.arrived <- c
			select {
			case <-arm.release:
			case <-m.closing:
			}
		default:
			select {
			case <-time.After(hold):
			case <-m.closing:
			}
		}
		sdk.ServeHTTP(w, r)
		answered()
	})
}

// journalStatus reads the status of the operation journaled with key, as
// the call arrives: the worker must have committed it as started before
// it sent the call. PostgreSQL may be restarting or failing over just
// then: it tries for up to three seconds, then says journalUnread.
func (m *mcpServer) journalStatus(ctx context.Context, key string) string {
	if key == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		var status string
		err := m.pool.QueryRow(ctx, `SELECT status FROM operations WHERE idempotency_key = $1`, key).Scan(&status)
		switch {
		case err == nil:
			return status
		case errors.Is(err, pgx.ErrNoRows):
			return ""
		}
		select {
		case <-ctx.Done():
			return journalUnread
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// arm makes the server drop, or hold, the next call it receives, and
// returns the channel that receives that call and the function that lets
// a held one go (and takes the arm back if no call came).
func (m *mcpServer) arm(drop bool) (<-chan *mcpCall, func()) {
	a := &mcpArm{drop: drop, arrived: make(chan *mcpCall, 1), release: make(chan struct{})}
	m.mu.Lock()
	m.armed = a
	m.mu.Unlock()
	var once sync.Once
	return a.arrived, func() {
		once.Do(func() {
			m.mu.Lock()
			if m.armed == a {
				m.armed = nil
			}
			m.mu.Unlock()
			close(a.release)
		})
	}
}

// received returns a copy of every call received so far.
func (m *mcpServer) received() []mcpCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]mcpCall, len(m.calls))
	for i, c := range m.calls {
		out[i] = *c
	}
	return out
}

// worker records the name of the worker at ip, which its calls are
// recorded with.
func (m *mcpServer) worker(ip, name string) {
	m.mu.Lock()
	m.workers[ip] = name
	m.mu.Unlock()
}

// mcpFlags are the worker flags that make the run's MCP server theirs:
// its address is private (the harness's link), and refunds wait for
// approval.
func (s *system) mcpFlags() []string {
	return []string{"--mcp-server", mcpName + "=" + s.mcp.url, "--mcp-allow-private",
		"--mcp-approve", mcpRefundTool, "--approval-ttl", approvalTTL.String()}
}
