package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// TestTriggerDecodedBeforeItsCommitIsVisibleIsAnsweredOnceTheCommitIs
// proves that Baton is safe by construction against logical decoding's
// early delivery: PostgreSQL writes and flushes a commit record, then (with
// synchronous_commit on and a synchronous standby) waits for the standby
// before the commit becomes visible to other sessions, and a logical WAL
// sender decodes what is flushed locally without waiting. With the
// standby's WAL receiver paused, the relay publishes the trigger of a
// message whose transaction no other session can see yet; the worker's
// claim must wait for that commit instead of finding nothing and acking
// the trigger. The relay's sweep runs once an hour, so nothing but this
// trigger can bring the turn about.
//
// The claim waits because its first statement locks the conversation row
// FOR UPDATE, which conflicts with every lock the producer's transaction
// holds on that row: its FOR NO KEY UPDATE and final UPDATE
// (schema.InsertMessageTx), and even the FOR KEY SHARE that the foreign
// keys of the message and outbox rows take. This test fails when the
// claim's SELECT loses its FOR UPDATE (the claim finds no pending row and
// acks the trigger, and no reply comes), and when the claim takes only FOR
// NO KEY UPDATE while the producer no longer locks and updates the
// conversation (the foreign keys' FOR KEY SHARE does not hold off a FOR NO
// KEY UPDATE). Either lock alone keeps it passing.
func TestTriggerDecodedBeforeItsCommitIsVisibleIsAnsweredOnceTheCommitIs(t *testing.T) {
	t.Parallel()
	ha := testenv.PrimaryWithStandby(t, testenv.HAOptions{Synchronous: true})
	ns := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	nc, err := natsclient.Connect(ns.URL, natsclient.MaxReconnects(-1), natsclient.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	_, js := ns.Connect(t)
	stream := batonnats.StreamConfig{Partitions: 4}.WithDefaults()

	_, u, err := schema.CreateToken(ctx, ha.DB.Pool, "visibility")
	require.NoError(t, err)
	conv, _, err := schema.CreateConversation(ctx, ha.DB.Pool, u.ID, "visibility", "")
	require.NoError(t, err)

	r, err := relay.New(relay.Config{
		Stream:        stream,
		Slot:          "visibility",
		SweepInterval: time.Hour,
		SweepAge:      time.Hour,
	}, ha.DB.Pool, nc)
	require.NoError(t, err)
	outboxtest.RunInBackground(t, "relay", r.Run)
	// The relay provisions the stream before it streams; the worker joins
	// it after that.
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		err := ha.DB.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = 'visibility'`).Scan(&n)
		return err == nil && n == 1
	}, "the relay streams from its slot")

	var replies testenv.Signal
	var mu sync.Mutex
	replied := map[string]time.Time{} // turn id -> when its reply committed
	w, err := New(Config{
		Agent:            Echo{},
		Stream:           stream,
		Lease:            5 * time.Second,
		Debounce:         NoDebounce,
		RecoveryInterval: time.Hour,
		ShutdownTimeout:  3 * time.Second,
		OnConversationEvent: func(ev batonnats.ConversationEvent) {
			if ev.Type == batonnats.EventReplied && ev.ConversationID == conv.Key {
				mu.Lock()
				replied[ev.TurnID] = time.Now()
				mu.Unlock()
				replies.Notify()
			}
		},
	}, ha.DB.Pool, js)
	require.NoError(t, err)
	outboxtest.RunInBackground(t, "worker", w.Run)
	repliesSeen := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(replied)
	}

	// One turn end to end while the standby follows: the relay streams and
	// the worker pulls.
	postSynchronously(t, ha.DB.Pool, u.ID, "visibility", "warm-up", nil)
	testenv.WaitFor(t, &replies, time.Minute, func() bool { return repliesSeen() == 1 }, "the reply to the first message")

	info, err := js.Stream(ctx, stream.Name)
	require.NoError(t, err)
	si, err := info.Info(ctx)
	require.NoError(t, err)
	lastSeq := si.State.LastSeq

	require.NoError(t, ha.Standby.PauseWALReceiver(ctx))
	// Before the pool closes, which waits for the commit held up here.
	t.Cleanup(func() { _ = ha.Standby.ResumeWALReceiver() })
	sent := make(chan posted, 1)
	committed := make(chan time.Time, 1)
	go func() {
		postSynchronously(t, ha.DB.Pool, u.ID, "visibility", "while-the-standby-is-paused", sent)
		committed <- time.Now()
	}()
	producer := testenv.WaitOrTimeout(t, sent, 30*time.Second, "the message's transaction to reach its commit")
	id := producer.outboxID

	// The relay publishes the trigger although the commit is not visible:
	// the race this test is about does happen.
	testenv.Eventually(t, 30*time.Second, func() bool {
		si, err := info.Info(ctx)
		return err == nil && si.State.LastSeq > lastSeq
	}, "the relay publishes the trigger of outbox row %d while its commit waits for the standby", id)
	msg, err := info.GetMsg(ctx, lastSeq+1)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("outbox-%d", id), msg.Header.Get(batonnats.HeaderMsgID))
	var visible int
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM agent_outbox WHERE id = $1`, id).Scan(&visible))
	require.Zero(t, visible, "the outbox row is invisible to other sessions while its commit waits for the standby")
	select {
	case <-committed:
		t.Fatal("the commit returned while the synchronous standby's WAL receiver was paused")
	default:
	}

	// The worker has had the trigger: either its claim waits on the
	// conversation row, or (without the lock) it acked the trigger.
	consumer, err := js.Consumer(ctx, stream.Name, DefaultConsumerName)
	require.NoError(t, err)
	claimWaits := func() bool {
		var n int
		err := ha.DB.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND (query LIKE '%FROM conversations WHERE id = $1 FOR%' OR query LIKE '%c.id = ANY($1) ORDER BY c.id FOR UPDATE%')`).Scan(&n)
		return err == nil && n > 0
	}
	// A claim that did not wait for the producer (a lock that does not
	// conflict with the producer's) commits after the standby too.
	claimCommitWaits := func() bool {
		var n int
		err := ha.DB.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'SyncRep' AND pid <> $1`, producer.pid).Scan(&n)
		return err == nil && n > 0
	}
	triggerAcked := func() bool {
		ci, err := consumer.Info(ctx)
		return err == nil && ci.AckFloor.Stream > lastSeq
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return claimWaits() || claimCommitWaits() || triggerAcked() },
		"the worker's claim for outbox row %d either waits on the conversation row, or went past it", id)
	t.Logf("claim waiting on the conversation row: %v; claim past it, committing: %v; trigger acked already: %v",
		claimWaits(), claimCommitWaits(), triggerAcked())

	resumed := time.Now()
	require.NoError(t, ha.Standby.ResumeWALReceiver())
	testenv.WaitFor(t, &replies, 2*time.Second, func() bool { return repliesSeen() == 2 },
		"the reply to outbox row %d within 2s of the standby's resume: the claim must wait for the commit to become visible, not find nothing and ack the trigger", id)
	mu.Lock()
	var last time.Time
	for _, at := range replied {
		if at.After(last) {
			last = at
		}
	}
	mu.Unlock()
	commitAt := testenv.WaitOrTimeout(t, committed, 10*time.Second, "the producer's commit to return")
	t.Logf("after the resume: the producer's commit returned in %s, the reply committed in %s",
		commitAt.Sub(resumed).Round(100*time.Microsecond), last.Sub(resumed).Round(100*time.Microsecond))

	var done, replies2 int
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'done'), (SELECT count(*) FROM messages WHERE role = 'assistant')
		FROM agent_outbox`).Scan(&done, &replies2))
	require.Equal(t, 2, done, "both messages are answered")
	require.Equal(t, 2, replies2, "one reply each")
}

// posted is a message whose transaction is about to commit.
type posted struct {
	outboxID int64
	// pid is the producer's server process.
	pid int32
}

// postSynchronously commits one user message the way a production producer does, with
// synchronous_commit on (the harness turns it on for a synchronous standby;
// SET LOCAL makes the test independent of that). The outbox row's id and
// the producer's server process are sent to sent, when given, before the
// commit.
func postSynchronously(t *testing.T, pool *pgxpool.Pool, owner int64, conversation, messageID string, sent chan<- posted) {
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: owner, ConversationID: conversation, MessageID: messageID, Content: "hello"})
		if err != nil {
			return err
		}
		if sent != nil {
			p := posted{outboxID: res.OutboxID}
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p.pid); err != nil {
				return err
			}
			sent <- p
		}
		return nil
	})
	if err != nil {
		t.Errorf("post %s: %v", messageID, err)
	}
}
