package agent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

var slotCounter atomic.Int64

// stack is a real Postgres, NATS and relay, for turns run by the real
// worker with the OpenAI agent.
type stack struct {
	t      testing.TB
	db     *testenv.DB
	nc     *natsclient.Conn
	js     jetstream.JetStream
	stream batonnats.StreamConfig
	owner  int64
	states chan batonnats.ConversationEvent
	nats   *testenv.NATS
}

func newStack(t testing.TB) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{t: t, db: testenv.Database(t), states: make(chan batonnats.ConversationEvent, 64)}
	s.nats = testenv.StartNATS(t)
	s.nc, s.js = s.nats.Connect(t)
	s.stream = batonnats.StreamConfig{Partitions: 4}.WithDefaults()
	_, _, err := batonnats.ProvisionStream(ctx, s.js, s.stream, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	_, u, err := schema.CreateToken(ctx, s.db.Pool, "tester")
	require.NoError(t, err)
	s.owner = u.ID

	slot := fmt.Sprintf("agent_%d_%d", os.Getpid(), slotCounter.Add(1))
	r, err := relay.New(relay.Config{
		Stream:        s.stream,
		Slot:          slot,
		SweepInterval: time.Hour,
		SweepAge:      time.Hour,
	}, s.db.Pool, s.nc)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	// The relay updates the stream before it replicates; a worker that
	// creates its consumer meanwhile trips a data race inside the NATS
	// server. Workers start once the relay's slot is active.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active bool
		err := s.db.Pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err == nil && active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay slot %s not active within 30s (last error: %v)", slot, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// startWorker runs a worker with a; the returned function stops it and
// waits for it (also done when the test ends).
func (s *stack) startWorker(a consumer.Agent, reg *agent.Registry, change func(*consumer.Config)) (stop func()) {
	s.t.Helper()
	cfg := consumer.Config{
		Stream:              s.stream,
		Agent:               a,
		Tools:               reg.Tools(),
		Lease:               2 * time.Second,
		Debounce:            consumer.NoDebounce,
		BusyDelay:           50 * time.Millisecond,
		RetryDelay:          200 * time.Millisecond,
		RecoveryInterval:    500 * time.Millisecond,
		ShutdownTimeout:     3 * time.Second,
		OnConversationEvent: func(c batonnats.ConversationEvent) { s.states <- c },
	}
	if change != nil {
		change(&cfg)
	}
	w, err := consumer.New(cfg, s.db.Pool, s.js)
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(s.t, err)
			case <-time.After(30 * time.Second):
				s.t.Error("worker did not stop within 30s of its context ending")
			}
		})
	}
	s.t.Cleanup(stop)
	return stop
}

// send commits a user message and its outbox row, as the API does, in a
// conversation whose key is its id (as for a conversation that existed
// before keys were the server's), so the test reads rows by that id.
func (s *stack) send(conversationID, messageID, content string) {
	s.t.Helper()
	ctx := context.Background()
	_, err := s.db.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) VALUES ($1, $1, $2) ON CONFLICT DO NOTHING`, conversationID, s.owner)
	require.NoError(s.t, err)
	err = pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		// Logical decoding sees the commit at once (the test cluster runs
		// with synchronous_commit off).
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: s.owner, ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	})
	require.NoError(s.t, err)
}

// await returns the first committed state change of the conversation to
// one of want.
func (s *stack) await(conversationID string, want ...batonnats.EventType) batonnats.ConversationEvent {
	s.t.Helper()
	return s.awaitWithin(30*time.Second, conversationID, want...)
}

// awaitWithin is await with its own timeout.
func (s *stack) awaitWithin(within time.Duration, conversationID string, want ...batonnats.EventType) batonnats.ConversationEvent {
	s.t.Helper()
	timeout := time.After(within)
	for {
		select {
		case c := <-s.states:
			if c.ConversationID != conversationID {
				continue
			}
			for _, w := range want {
				if c.Type == w {
					return c
				}
			}
		case <-timeout:
			s.t.Fatalf("conversation %s reached none of %v within %s", conversationID, want, within)
		}
	}
}

// receiver is a webhook endpoint that applies each idempotency key once,
// as a well-behaved system does, and fails its first delivery.
type receiver struct {
	*httptest.Server
	mu         sync.Mutex
	deliveries []string
	applied    map[string]int
	got        chan struct{}
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{applied: map[string]int{}, got: make(chan struct{}, 16)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		key := req.Header.Get("Idempotency-Key")
		r.mu.Lock()
		r.deliveries = append(r.deliveries, key)
		first := len(r.deliveries) == 1
		if !first {
			r.applied[key]++
		}
		r.mu.Unlock()
		if first {
			// Lost on the way: the tool delivers again with the same key.
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"ticket":7}`)
		r.got <- struct{}{}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) snapshot() ([]string, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	applied := map[string]int{}
	for k, v := range r.applied {
		applied[k] = v
	}
	return append([]string(nil), r.deliveries...), applied
}

func ticketTools(t *testing.T, hook string) *agent.Registry {
	t.Helper()
	ticket, err := agent.Webhook(agent.WebhookConfig{URL: hook, Name: "open_ticket", Description: "Opens a support ticket.", RetryDelay: time.Millisecond})
	require.NoError(t, err)
	return agent.NewRegistry(agent.Clock(nil), ticket)
}

func TestAReadThenAWriteThenAnAnswerCommitOneReplyWithBothOperations(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	hook := newReceiver(t)
	reg := ticketTools(t, hook.URL)
	model := agenttest.NewServer(t,
		agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_clock", Name: "clock", Arguments: `{}`}}},
		agenttest.Response{Content: "Opening a ticket.", ToolCalls: []agenttest.ToolCall{{ID: "call_ticket", Name: "open_ticket", Arguments: `{"payload":{"title":"printer on fire"}}`}}},
		// The model call after the write fails once: it is retried, the
		// write is not.
		agenttest.Response{Status: http.StatusInternalServerError, Body: `{"error":{"message":"overloaded"}}`},
		agenttest.Response{Content: "Ticket 7 is open."},
	)
	a := newAgent(t, model, nil)
	s.startWorker(a, reg, nil)
	live, err := s.nc.SubscribeSync(batonnats.LiveConversationSubject("conv-ticket"))
	require.NoError(t, err)
	require.NoError(t, s.nc.Flush())

	s.send("conv-ticket", "m1", "my printer is on fire, open a ticket")
	replied := s.await("conv-ticket", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, replied.Type)

	var role, content string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT role, content FROM messages WHERE id = $1`, replied.MessageID).Scan(&role, &content))
	require.Equal(t, schema.RoleAssistant, role)
	require.Equal(t, "Opening a ticket.\n\nTicket 7 is open.", content)
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = 'conv-ticket' AND role = 'assistant'`), "one reply")

	rows, err := s.db.Pool.Query(context.Background(), `
		SELECT tool, tool_version, effect, status, tool_call_id, COALESCE(idempotency_key, ''), run_id, COALESCE(message_id, '')
		FROM operations WHERE conversation_id = 'conv-ticket' ORDER BY id`)
	require.NoError(t, err)
	type op struct{ tool, version, effect, status, callID, key, runID, messageID string }
	ops, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (op, error) {
		var o op
		return o, r.Scan(&o.tool, &o.version, &o.effect, &o.status, &o.callID, &o.key, &o.runID, &o.messageID)
	})
	require.NoError(t, err)
	require.Len(t, ops, 2, "two operations: the read and the write")
	require.Equal(t, op{"clock", "1", "read", "completed", "call_clock", ops[0].key, replied.RunID, replied.MessageID}, ops[0])
	require.Equal(t, op{"open_ticket", "1", "write", "completed", "call_ticket", ops[1].key, replied.RunID, replied.MessageID}, ops[1])

	key := consumer.IdempotencyKey(consumer.TurnScope(replied.ConversationID, replied.TurnID, 0), "call_ticket")
	require.Equal(t, key, ops[1].key)
	deliveries, applied := hook.snapshot()
	require.Equal(t, []string{key, key}, deliveries, "the retried delivery carries the same idempotency key")
	require.Equal(t, map[string]int{key: 1}, applied, "the write took effect once")
	require.Len(t, model.Requests(), 4)

	// What streamed live on the run's subject is the committed reply.
	var events []batonnats.LiveDelta
	for len(events) == 0 || events[len(events)-1].Type != batonnats.DeltaDone {
		msg, err := live.NextMsg(5 * time.Second)
		require.NoError(t, err)
		require.Equal(t, batonnats.LiveSubject("conv-ticket", replied.RunID), msg.Subject)
		e, err := batonnats.ParseLiveDelta(msg.Data)
		require.NoError(t, err)
		require.Equal(t, int64(len(events)+1), e.Seq)
		events = append(events, e)
	}
	require.Equal(t, content, batonnats.LiveText(events))
}

func TestA401FailsTheTurnVisiblyNamingTheCause(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	refused := agenttest.Response{Status: http.StatusUnauthorized, Body: `{"error":{"message":"Incorrect API key provided: sk-te***st","type":"invalid_request_error","code":"invalid_api_key"}}`}
	// The script would allow three attempts; a refused key must end the
	// turn after the first.
	model := agenttest.NewServer(t, refused, refused, refused)
	reg := agent.NewRegistry()
	a := newAgent(t, model, nil)
	s.startWorker(a, reg, func(c *consumer.Config) { c.MaxAttempts = 3 })

	s.send("conv-401", "m1", "hello")
	failed := s.await("conv-401", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventFailed, failed.Type)
	var role, content, detail string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT role, content, detail FROM messages WHERE id = $1`, failed.MessageID).Scan(&role, &content, &detail))
	require.Equal(t, schema.RoleError, role)
	require.Contains(t, detail, "the model server refused the API key", "the operator's detail names the cause")
	require.Contains(t, detail, "BATON_MODEL_API_KEY", "and the setting to check")
	require.Contains(t, content, "could not answer", "the user reads that the turn failed")
	require.NotContains(t, content, "BATON_", "the user's text names no setting")
	require.NotContains(t, content, "--", "the user's text names no flag")
	require.NotContains(t, content, "http", "the user's text names no server")
	require.NotContains(t, content, "sk-te", "the visible error must not quote the key")
	require.NotContains(t, detail, "sk-te", "nor the operator's detail")
	require.Equal(t, 0, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = 'conv-401' AND role = 'assistant'`))
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM agent_outbox WHERE conversation_id = 'conv-401' AND status = 'error'`))
	require.Len(t, model.Requests(), 1, "a refused key is terminal: no second attempt")
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM agent_runs WHERE conversation_id = 'conv-401'`))
}

// TestAnAttemptCutShortAfterItsWriteGoesOnFromTheJournal: the worker shuts
// down while the model writes the answer after a completed write. The
// turn goes back to pending, and the next worker goes on from its journal
// of steps: it asks the model for the answer with the write's journaled
// result, and never sends the write again.
func TestAnAttemptCutShortAfterItsWriteGoesOnFromTheJournal(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	hook := newReceiver(t)
	reg := ticketTools(t, hook.URL)
	model := agenttest.NewServer(t,
		agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_ticket", Name: "open_ticket", Arguments: `{"payload":"open it"}`}}},
		// The worker goes away while the model writes the answer.
		agenttest.Response{Hang: true},
		agenttest.Response{Content: "Ticket opened."},
	)
	a := newAgent(t, model, nil)
	stop := s.startWorker(a, reg, func(c *consumer.Config) { c.ShutdownTimeout = 100 * time.Millisecond })

	s.send("conv-cut", "m1", "open a ticket")
	<-model.Arrived()
	<-hook.got
	// The second model request means the write was journaled completed.
	<-model.Arrived()
	stop()
	pending := s.await("conv-cut", batonnats.EventReplied, batonnats.EventFailed, batonnats.EventPending)
	require.Equal(t, batonnats.EventPending, pending.Type, "an attempt whose write is journaled goes back to pending")

	s.startWorker(a, reg, nil)
	replied := s.await("conv-cut", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, replied.Type)
	var content string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE id = $1`, replied.MessageID).Scan(&content))
	require.Equal(t, "Ticket opened.", content)
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM operations WHERE conversation_id = 'conv-cut' AND effect = 'write' AND status = 'completed' AND message_id = $1`, replied.MessageID))
	_, applied := hook.snapshot()
	require.Len(t, applied, 1)
	for _, n := range applied {
		require.Equal(t, 1, n, "the write took effect once")
	}
	reqs := model.Requests()
	require.Len(t, reqs, 3, "the model is asked for the answer again, never for the write")
	require.Contains(t, reqs[2].ToolMessages(), "call_ticket", "with the write's journaled result")
}
