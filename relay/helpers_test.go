package relay

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// bundle is what most relay tests need: a migrated database, a NATS
// server, a user to own conversations and a relay configuration with a slot
// of the test's own.
type bundle struct {
	pool  *pgxpool.Pool
	dbURL string
	nats  *testenv.NATS
	js    jetstream.JetStream
	owner int64
	cfg   Config
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := testenv.Database(t)
	return setupWith(t, db.Pool, db.URL, "s_"+db.Name)
}

func setupWith(t *testing.T, pool *pgxpool.Pool, dbURL, slot string) *bundle {
	t.Helper()
	n := testenv.StartNATS(t)
	_, js := n.Connect(t)
	_, user, err := schema.CreateToken(context.Background(), pool, "relay-test")
	require.NoError(t, err)
	return &bundle{
		pool:  pool,
		dbURL: dbURL,
		nats:  n,
		js:    js,
		owner: user.ID,
		cfg: Config{
			Slot:              slot,
			StatusInterval:    100 * time.Millisecond,
			HeartbeatInterval: 200 * time.Millisecond,
			// Sweeps only where a test asks for them.
			SweepInterval: time.Hour,
			SweepAge:      time.Hour,
			AckTimeout:    2 * time.Second,
			StandbyRetry:  200 * time.Millisecond,
			RetryMax:      500 * time.Millisecond,
		},
	}
}

// relayConn connects the way `baton relay` does: no buffering while
// reconnecting, reconnecting forever.
func (b *bundle) relayConn(t testing.TB) *natsclient.Conn {
	t.Helper()
	nc, err := natsclient.Connect(b.nats.URL,
		natsclient.MaxReconnects(-1),
		natsclient.ReconnectWait(100*time.Millisecond),
		natsclient.ReconnectBufSize(-1),
		natsclient.RetryOnFailedConnect(true))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// start runs a relay until the test ends (or stop is called), failing the
// test if Run returns an error.
func (b *bundle) start(t testing.TB, cfg Config) (r *Relay, stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	r, err := New(cfg, b.pool, b.relayConn(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay Run returned %v, want nil after cancel", err)
				}
			case <-time.After(30 * time.Second):
				buf := make([]byte, 1<<20)
				t.Errorf("relay did not stop within 30s of cancel:\n%s", buf[:runtime.Stack(buf, true)])
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// waitActive waits until r holds its slot and streams.
func waitActive(t testing.TB, r *Relay) {
	t.Helper()
	require.Eventually(t, r.active.Load, 30*time.Second, 10*time.Millisecond, "the relay did not start streaming")
}

func testLogger(t testing.TB) *zerolog.Logger {
	log := zerolog.Nop()
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Str("component", "relay").Logger()
	}
	return &log
}

// conversation creates a conversation whose key is its id, as for
// conversations that existed before keys were the server's: the relay must
// carry any key, with any characters, into subjects and headers.
func (b *bundle) conversation(t testing.TB, id string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `INSERT INTO conversations (id, public_id, owner_id) VALUES ($1, $1, $2)`, id, b.owner)
	require.NoError(t, err)
}

// insert commits one user message with its outbox row and returns the row.
func (b *bundle) insert(t testing.TB, conversationID, messageID string) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: b.owner, ConversationID: conversationID, MessageID: messageID, Content: "hello"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return res.OutboxID
}

// event is one message of the outbox stream.
type event struct {
	Seq            uint64
	Stored         time.Time
	Subject        string
	MsgID          string
	OutboxID       int64
	ConversationID string
	Reason         string
	Trigger        batonnats.Trigger
}

// streamEvents reads every message the stream holds, in stream order.
func streamEvents(t testing.TB, js jetstream.JetStream) []event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, batonnats.DefaultStream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	want := int(info.State.Msgs)
	if want == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	out := make([]event, 0, want)
	for len(out) < want {
		batch, err := c.Fetch(min(1000, want-len(out)), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			require.NoError(t, err)
			tr, err := batonnats.ParseTrigger(m.Data())
			require.NoError(t, err)
			id, err := strconv.ParseInt(m.Headers().Get(batonnats.HeaderOutboxID), 10, 64)
			require.NoError(t, err)
			conv, err := batonnats.DecodeHeaderValue(m.Headers().Get(batonnats.HeaderConversationID))
			require.NoError(t, err)
			out = append(out, event{
				Seq:            md.Sequence.Stream,
				Stored:         md.Timestamp,
				Subject:        m.Subject(),
				MsgID:          m.Headers().Get(batonnats.HeaderMsgID),
				OutboxID:       id,
				ConversationID: conv,
				Reason:         m.Headers().Get(batonnats.HeaderReason),
				Trigger:        tr,
			})
		}
		require.NoError(t, batch.Error())
		require.NotZero(t, got, "the stream reported %d messages but a fetch after %d returned none", want, len(out))
	}
	return out
}

// streamCount returns the number of messages in the stream (0 when it does
// not exist yet).
func streamCount(js jetstream.JetStream) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, batonnats.DefaultStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return int(info.State.Msgs)
}

// waitStreamCount waits until the stream holds at least n messages.
func waitStreamCount(t testing.TB, js jetstream.JetStream, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := streamCount(js)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream holds %d messages after %s, want %d", got, within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireExactlyOnce checks that the stream holds one insert event for each
// of ids, and nothing else.
func requireExactlyOnce(t testing.TB, events []event, ids []int64) {
	t.Helper()
	seen := map[string]int{}
	byRow := map[int64]int{}
	for _, e := range events {
		seen[e.MsgID]++
		byRow[e.OutboxID]++
		require.Equal(t, "outbox-"+strconv.FormatInt(e.OutboxID, 10), e.MsgID, "insert events carry Nats-Msg-Id outbox-<id>")
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "Nats-Msg-Id %s is in the stream %d times, want once", id, n)
	}
	missing := []int64{}
	for _, id := range ids {
		if byRow[id] == 0 {
			missing = append(missing, id)
		}
	}
	sort.Slice(missing, func(i, j int) bool { return missing[i] < missing[j] })
	require.Empty(t, missing, "outbox rows missing from the stream")
	require.Len(t, events, len(ids), "the stream holds events of rows that were never inserted")
}

// slotConfirmed returns the slot's confirmed_flush_lsn.
func slotConfirmed(t testing.TB, pool *pgxpool.Pool, slot string) pglogrepl.LSN {
	t.Helper()
	var s *string
	err := pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s)
	require.NoError(t, err, "slot %s", slot)
	if s == nil {
		return 0
	}
	lsn, err := pglogrepl.ParseLSN(*s)
	require.NoError(t, err)
	return lsn
}

func currentLSN(t testing.TB, pool *pgxpool.Pool) pglogrepl.LSN {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// waitConfirmedPast waits until the slot's confirmed position reaches lsn.
func waitConfirmedPast(t testing.TB, pool *pgxpool.Pool, slot string, lsn pglogrepl.LSN, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := slotConfirmed(t, pool, slot)
		if got >= lsn {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s confirmed %s after %s, want at least %s", slot, got, within, lsn)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func outboxIDs(t testing.TB, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM agent_outbox ORDER BY id`)
	require.NoError(t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

func convID(i int) string { return fmt.Sprintf("conv.%d *> über", i) }
