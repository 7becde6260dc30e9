package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/pgcluster"
)

// StackOptions configure a Stack.
type StackOptions struct {
	// Binary is the baton binary every process runs. Required.
	Binary string
	// NATSURL is the NATS server (or servers, comma-separated). Required.
	NATSURL string
	// RelayArgs, APIArgs and WorkerArgs are extra arguments of each
	// process. A nil WorkerArgs with NoWorker set starts no worker.
	RelayArgs, APIArgs, WorkerArgs []string
	// NoWorker leaves the worker out, for a benchmark that starts it
	// itself.
	NoWorker bool
}

// Client is a user of an API that serves Baton's routes for messages and
// events: a Stack's API, or the floor chain's.
type Client struct {
	// APIURL is the API's root, such as http://127.0.0.1:1234.
	APIURL string
	// Token is the user's bearer token.
	Token string
	// HTTP sends the requests.
	HTTP *http.Client
}

// Stack is a migrated database with a relay, an API and a worker running
// as baton processes, and a user with a token.
type Stack struct {
	Client
	DB                 *DB
	Relay, API, Worker *Process
	UserID             int64
	opts               StackOptions
}

// StartStack migrates a new database of pg with the binary and starts the
// relay, then the API (which owns the events stream), then the worker,
// each once the one before is ready.
func StartStack(tb testing.TB, pg *Postgres, opts StackOptions) *Stack {
	tb.Helper()
	db := pg.Database(tb)
	db.Migrate(tb, opts.Binary)
	// The binary makes the token, so that a binary of an earlier commit
	// gets one its own schema knows.
	out, err := Run(opts.Binary, "token", "create", "--user", "bench", "--database-url", db.URL, "--log-format", "json")
	if err != nil {
		tb.Fatalf("bench: token create: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	s := &Stack{DB: db, UserID: db.Count(tb, `SELECT id FROM users WHERE name = 'bench'`), opts: opts,
		Client: Client{Token: strings.TrimSpace(lines[len(lines)-1]), HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}}
	tb.Cleanup(s.HTTP.CloseIdleConnections)
	s.Relay = Start(tb, "relay", opts.Binary, append([]string{"relay",
		"--database-url", db.URL, "--nats-url", opts.NATSURL,
		// Slot names are global to the server; databases are not.
		"--slot", "baton_" + db.Name}, opts.RelayArgs...)...)
	s.Relay.WaitLogged(tb, "connected; streaming", time.Minute)
	port, err := pgcluster.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s.APIURL = "http://" + addr
	s.API = Start(tb, "api", opts.Binary, append([]string{"api",
		"--database-url", db.URL, "--nats-url", opts.NATSURL, "--http-addr", addr}, opts.APIArgs...)...)
	s.API.WaitLogged(tb, "serving HTTP API", time.Minute)
	if !opts.NoWorker {
		s.Worker = s.StartWorker(tb, "", opts.WorkerArgs...)
	}
	return s
}

// StartWorker starts a worker of the stack with args, connected to the
// database through dbURL (the stack's database when empty: a Wire's
// address, say), and waits until it reads.
func (s *Stack) StartWorker(tb testing.TB, dbURL string, args ...string) *Process {
	tb.Helper()
	if dbURL == "" {
		dbURL = s.DB.URL
	}
	w := Start(tb, "worker", s.opts.Binary, append([]string{"worker",
		"--database-url", dbURL, "--nats-url", s.opts.NATSURL}, args...)...)
	w.WaitLogged(tb, "worker started", time.Minute)
	return w
}

// Stop stops the stack's processes, the worker first.
func (s *Stack) Stop() {
	for _, p := range []*Process{s.Worker, s.API, s.Relay} {
		if p != nil {
			p.Stop()
		}
	}
}

// Do sends an API request with the stack's token and returns the status
// and body.
func (s *Client) Do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.APIURL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// CreateConversation creates a conversation through the API.
func (s *Client) CreateConversation(tb testing.TB, id string) {
	tb.Helper()
	status, body, err := s.Do(context.Background(), http.MethodPost, "/v1/conversations", map[string]string{"id": id})
	if err != nil || (status != http.StatusCreated && status != http.StatusOK) {
		tb.Fatalf("bench: create conversation %s: %d %s %v", id, status, body, err)
	}
}

// Post sends a user message through the API, which answers once the
// message and its outbox row committed.
func (s *Client) Post(ctx context.Context, conversation, id, content string) error {
	status, body, err := s.Do(ctx, http.MethodPost, "/v1/conversations/"+url.PathEscape(conversation)+"/messages",
		map[string]string{"id": id, "content": content})
	if err != nil {
		return err
	}
	if status != http.StatusAccepted {
		return fmt.Errorf("post message %s to %s: %d %s", id, conversation, status, body)
	}
	return nil
}
