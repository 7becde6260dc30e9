package consumer

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

var slotCounter atomic.Int64

// bundle is one test's Postgres, NATS, relay and user.
type bundle struct {
	t      testing.TB
	db     *testenv.DB
	nats   *testenv.NATS
	nc     *natsclient.Conn
	js     jetstream.JetStream
	stream batonnats.StreamConfig
	owner  int64
}

// setup starts a database, a NATS server and a real relay for t.
func setup(t testing.TB) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{t: t, db: testenv.Database(t), nats: testenv.StartNATS(t)}
	var err error
	b.nc, err = natsclient.Connect(b.nats.URL, natsclient.MaxReconnects(-1), natsclient.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(b.nc.Close)
	b.js, err = jetstream.New(b.nc)
	require.NoError(t, err)
	b.stream = batonnats.StreamConfig{Partitions: 4}.WithDefaults()
	_, err = batonnats.EnsureStream(ctx, b.js, b.stream)
	require.NoError(t, err)
	_, u, err := schema.CreateToken(ctx, b.db.Pool, "tester")
	require.NoError(t, err)
	b.owner = u.ID

	r, err := relay.New(relay.Config{
		Stream:        b.stream,
		Slot:          fmt.Sprintf("turns_%d_%d", os.Getpid(), slotCounter.Add(1)),
		SweepInterval: time.Hour,
		SweepAge:      time.Hour,
	}, b.db.Pool, b.nc, zerolog.Nop())
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return b
}

// testConfig is a worker configuration with short timings for tests.
func (b *bundle) testConfig() Config {
	return Config{
		Pool:             b.db.Pool,
		JetStream:        b.js,
		Stream:           b.stream,
		Lease:            2 * time.Second,
		Debounce:         NoDebounce,
		BusyDelay:        50 * time.Millisecond,
		RetryDelay:       200 * time.Millisecond,
		RecoveryInterval: 500 * time.Millisecond,
		ShutdownTimeout:  3 * time.Second,
	}
}

// startWorker runs a worker until the test ends.
func (b *bundle) startWorker(cfg Config) *Worker {
	b.t.Helper()
	w, err := New(cfg)
	require.NoError(b.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(b.t, err)
		case <-time.After(30 * time.Second):
			b.t.Error("worker did not stop within 30s of its context ending")
		}
	})
	return w
}

func (b *bundle) conversation(id string) {
	b.t.Helper()
	_, _, err := schema.CreateConversation(context.Background(), b.db.Pool, b.owner, id, "")
	require.NoError(b.t, err)
}

func (b *bundle) send(conversationID, messageID, content string) int64 {
	b.t.Helper()
	var res schema.InsertResult
	err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		// The test cluster turns synchronous_commit off for speed, which
		// holds a commit back from logical decoding until the WAL writer
		// flushes it (up to 200 ms); a production producer commits
		// synchronously.
		if _, err := tx.Exec(context.Background(), `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		var err error
		res, err = schema.InsertMessageTx(context.Background(), tx, schema.UserMessage{ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	})
	require.NoError(b.t, err)
	return res.OutboxID
}

func (b *bundle) count(query string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// eventually polls cond every 10ms until it holds or timeout passes.
func (b *bundle) eventually(timeout time.Duration, cond func() bool, format string, args ...any) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("after %s: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settled waits until every outbox row is done or error and the consumer
// group holds no unacknowledged or undelivered trigger.
func (b *bundle) settled(timeout time.Duration) {
	b.t.Helper()
	b.eventually(timeout, func() bool {
		if b.count(`SELECT count(*) FROM agent_outbox WHERE status NOT IN ('done', 'error')`) > 0 {
			return false
		}
		info, err := b.js.Consumer(context.Background(), b.stream.Name, DefaultConsumerName)
		if err != nil {
			return false
		}
		ci, err := info.Info(context.Background())
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.NumRedelivered == 0
	}, "outbox rows are all done or error and every trigger is acked")
}

const DefaultConsumerName = batonnats.DefaultConsumer

// states records state changes.
type states struct {
	mu  sync.Mutex
	all []StateChange
}

func (s *states) record(c StateChange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, c)
}

func (s *states) has(conversationID string, st State) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.all {
		if c.ConversationID == conversationID && c.State == st {
			return true
		}
	}
	return false
}
