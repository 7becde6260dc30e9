// Package outboxtest gives the tests of what consumes the outbox stream
// (the turn runner, consumer groups, replay) the same start: a fresh
// migrated database, a NATS server with the outbox stream, a user, and a
// real relay streaming from its own slot.
package outboxtest

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
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

var slotCounter atomic.Int64

// Bundle is one test's Postgres, NATS, relay and user.
type Bundle struct {
	T      testing.TB
	DB     *testenv.DB
	NATS   *testenv.NATS
	NC     *natsclient.Conn
	JS     jetstream.JetStream
	Stream batonnats.StreamConfig
	// Owner is the user that owns the conversations the bundle creates.
	Owner int64

	mu   sync.Mutex
	keys map[string]string
}

// Setup starts a database, a NATS server with the outbox stream (four
// partitions) and a real relay for t, all stopped when t ends.
func Setup(t testing.TB) *Bundle {
	t.Helper()
	return SetupOn(t, testenv.Database(t), testenv.StartNATS(t))
}

// SetupOn is Setup on a database and a NATS server of the caller's.
func SetupOn(t testing.TB, db *testenv.DB, nats *testenv.NATS) *Bundle {
	t.Helper()
	ctx := context.Background()
	b := &Bundle{T: t, DB: db, NATS: nats}
	var err error
	b.NC, err = natsclient.Connect(b.NATS.URL, natsclient.MaxReconnects(-1), natsclient.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(b.NC.Close)
	b.JS, err = jetstream.New(b.NC)
	require.NoError(t, err)
	b.Stream = batonnats.StreamConfig{Partitions: 4}.WithDefaults()
	_, _, err = batonnats.ProvisionStream(ctx, b.JS, b.Stream, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	_, u, err := schema.CreateToken(ctx, b.DB.Pool, "tester")
	require.NoError(t, err)
	b.Owner = u.ID

	r, err := relay.New(relay.Config{
		Stream:        b.Stream,
		Slot:          fmt.Sprintf("outboxtest_%d_%d", os.Getpid(), slotCounter.Add(1)),
		SweepInterval: time.Hour,
		SweepAge:      time.Hour,
	}, b.DB.Pool, b.NC)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	// The relay provisions the stream as it starts (an update of the one
	// made above). A consumer created meanwhile races that update inside
	// the embedded server, which the race detector reports; tests start
	// their workers once the relay streams.
	deadline := time.Now().Add(30 * time.Second)
	for !r.Active() {
		select {
		case err := <-done:
			t.Fatalf("outboxtest: the relay stopped before streaming: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "outboxtest: the relay did not stream within 30s")
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

// Conversation creates a conversation of the bundle's user with the given
// id, and returns its key (what agent_outbox.conversation_id, runs and
// subjects hold).
func (b *Bundle) Conversation(id string) string {
	b.T.Helper()
	c, _, err := schema.CreateConversation(context.Background(), b.DB.Pool, b.Owner, id, "")
	require.NoError(b.T, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil {
		b.keys = map[string]string{}
	}
	b.keys[id] = c.Key
	return c.Key
}

// Key returns the key of a conversation the bundle created.
func (b *Bundle) Key(id string) string {
	b.T.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	key, ok := b.keys[id]
	if !ok {
		b.T.Fatalf("outboxtest: no conversation %q was created", id)
	}
	return key
}

// Send commits one user message of the bundle's user and its outbox row,
// and returns the row.
func (b *Bundle) Send(conversationID, messageID, content string) int64 {
	b.T.Helper()
	var res schema.InsertResult
	err := pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
		// The test cluster turns synchronous_commit off for speed, which
		// holds a commit back from logical decoding until the WAL writer
		// flushes it (up to 200 ms); a production producer commits
		// synchronously.
		if _, err := tx.Exec(context.Background(), `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		var err error
		res, err = schema.InsertMessageTx(context.Background(), tx, schema.UserMessage{OwnerID: b.Owner, ConversationID: conversationID, MessageID: messageID, Content: content})
		return err
	})
	require.NoError(b.T, err)
	return res.OutboxID
}

// SendMany commits n user messages spread over conversations named
// "<prefix>.<i>", in transactions of up to 250, and returns their outbox
// rows.
func (b *Bundle) SendMany(n, conversations int, prefix string) []int64 {
	b.T.Helper()
	ctx := context.Background()
	for c := range conversations {
		b.Conversation(fmt.Sprintf("%s.%d", prefix, c))
	}
	ids := make([]int64, 0, n)
	for lo := 0; lo < n; lo += 250 {
		err := pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
			for i := lo; i < min(lo+250, n); i++ {
				res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{
					OwnerID:        b.Owner,
					ConversationID: fmt.Sprintf("%s.%d", prefix, i%conversations),
					MessageID:      fmt.Sprintf("%s-m%d", prefix, i),
					Content:        "hello",
				})
				if err != nil {
					return err
				}
				ids = append(ids, res.OutboxID)
			}
			return nil
		})
		require.NoError(b.T, err)
	}
	return ids
}

// Count runs a count query.
func (b *Bundle) Count(query string, args ...any) int {
	b.T.Helper()
	return testenv.Count(b.T, b.DB.Pool, query, args...)
}

// Eventually polls external state (database rows, stream and consumer
// counts, slot positions) every 10ms until cond holds, and fails the test
// after timeout. Where a hook can signal the change, wait on it instead
// (testenv.WaitFor).
func (b *Bundle) Eventually(timeout time.Duration, cond func() bool, format string, args ...any) {
	b.T.Helper()
	testenv.Eventually(b.T, timeout, cond, format, args...)
}

// RelayStreaming waits until the relay holds its slot, so that every row
// committed afterwards is announced once, by its insert (a row committed
// while the relay creates its slot may be announced by the relay's catch-up
// sweep too: two events for one row), and until it has provisioned the
// stream.
func (b *Bundle) RelayStreaming() {
	b.T.Helper()
	b.Eventually(30*time.Second, func() bool {
		// A slot being created is active too, held by a plain backend;
		// a streaming one is held by a WAL sender.
		return b.Count(`
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.database = current_database()`) == 1
	}, "the relay streams from its slot")
}

// ConsumerSettled waits until the durable consumer has nothing pending
// (undelivered) or unacknowledged, and no redelivery under way.
func (b *Bundle) ConsumerSettled(name string, timeout time.Duration) {
	b.T.Helper()
	b.Eventually(timeout, func() bool {
		c, err := b.JS.Consumer(context.Background(), b.Stream.Name, name)
		if err != nil {
			return false
		}
		ci, err := c.Info(context.Background())
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.NumRedelivered == 0
	}, "consumer %s has every event acked", name)
}

// RunInBackground runs run (a worker's, a group's or a relay's Run) until
// the test ends, then cancels it and fails the test when it returns an
// error or does not return within 30 seconds.
func RunInBackground(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "%s stopped with an error", name)
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop within 30s of its context ending", name)
		}
	})
}
