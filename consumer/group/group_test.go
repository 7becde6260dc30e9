package group

import (
	"context"
	"errors"
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

	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// bundle is one test's Postgres, NATS, relay and user.
type bundle struct {
	*outboxtest.Bundle
}

func setup(t testing.TB) *bundle {
	t.Helper()
	return &bundle{Bundle: outboxtest.Setup(t)}
}

// groupConfig is a group with short timings for tests.
func (b *bundle) groupConfig(name string, h Handler) Config {
	return Config{
		Name:            name,
		Handler:         h,
		Stream:          b.Stream,
		RetryMin:        10 * time.Millisecond,
		RetryMax:        100 * time.Millisecond,
		AckWait:         2 * time.Second,
		ShutdownTimeout: 5 * time.Second,
	}
}

// startGroup runs a group until stop is called or the test ends; stop
// returns what Run returned.
func (b *bundle) startGroup(cfg Config) (stop func() error) {
	b.T.Helper()
	g, err := New(cfg, b.DB.Pool, b.JS)
	require.NoError(b.T, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	var once sync.Once
	var runErr error
	stopped := false
	stopRun := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = errors.New("group did not stop within 30s of its context ending")
			}
		})
		return runErr
	}
	b.T.Cleanup(func() {
		// A test that stopped the group checked what Run returned.
		if !stopped {
			require.NoError(b.T, stopRun())
		}
	})
	return func() error {
		stopped = true
		return stopRun()
	}
}

func createEffects(t *testing.T, b *bundle) {
	_, err := b.DB.Pool.Exec(context.Background(), `CREATE TABLE test_effects (group_name TEXT NOT NULL, event_id TEXT NOT NULL, outbox_id BIGINT NOT NULL)`)
	require.NoError(t, err)
}

// recordEffect is a handler whose effect is one row per application; the
// table has no unique key, so an event applied twice would show.
func recordEffect(ctx context.Context, tx pgx.Tx, ev Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO test_effects (group_name, event_id, outbox_id) VALUES ($1, $2, $3)`, ev.Group, ev.ID, ev.OutboxID)
	return err
}

func TestThreeGroupsApplyEveryEventOnceWithOneCutOffHalfwayAndRestarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createEffects(t, b)
	b.RelayStreaming()
	const events = 5000

	b.startGroup(b.groupConfig("alpha", recordEffect))
	b.startGroup(b.groupConfig("gamma", recordEffect))

	// beta loses its NATS connection at its 2500th event, inside the
	// handler: that event (and whatever its lanes still hold) commits but
	// its ack never reaches the server, as when a process dies between
	// commit and ack. JetStream delivers those events again to the
	// restarted group, whose inbox must recognize them.
	betaConn, err := natsclient.Connect(b.NATS.URL)
	require.NoError(t, err)
	betaJS, err := jetstream.New(betaConn)
	require.NoError(t, err)
	var calls atomic.Int64
	halfway := make(chan struct{})
	beta := b.groupConfig("beta", func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if calls.Add(1) == events/2 {
			betaConn.Close()
			close(halfway)
		}
		return recordEffect(ctx, tx, ev)
	})
	beta.AckWait = time.Second
	betaGroup, err := New(beta, b.DB.Pool, betaJS)
	require.NoError(t, err)
	betaCtx, cancelBeta := context.WithCancel(context.Background())
	defer cancelBeta()
	betaDone := make(chan error, 1)
	go func() { betaDone <- betaGroup.Run(betaCtx) }()

	ids := b.SendMany(events, 50, "fan")
	require.Len(t, ids, events)

	select {
	case <-halfway:
	case <-time.After(90 * time.Second):
		t.Fatal("group beta did not reach its 2500th event within 90s")
	}
	select {
	case err := <-betaDone:
		require.ErrorContains(t, err, "stopped receiving events", "a group whose connection closes stops with an error")
	case <-time.After(30 * time.Second):
		t.Fatal("group beta did not stop within 30s of losing its connection")
	}
	atStop := b.Count(`SELECT count(*) FROM test_effects WHERE group_name = 'beta'`)
	require.Less(t, atStop, events, "beta stopped before it applied every event")

	var duplicates atomic.Int64
	beta2 := b.groupConfig("beta", recordEffect)
	beta2.AckWait = time.Second
	beta2.OnSettled = func(_ Event, o Outcome) {
		if o == OutcomeDuplicate {
			duplicates.Add(1)
		}
	}
	b.startGroup(beta2)

	for _, g := range []string{"alpha", "beta", "gamma"} {
		b.Eventually(90*time.Second, func() bool {
			return b.Count(`SELECT count(DISTINCT outbox_id) FROM test_effects WHERE group_name = $1`, g) == events
		}, "group %s applied all %d events", g, events)
		b.ConsumerSettled(g, 30*time.Second)
	}
	for _, g := range []string{"alpha", "beta", "gamma"} {
		require.Equal(t, events, b.Count(`SELECT count(*) FROM test_effects WHERE group_name = $1`, g), "group %s applied each event exactly once", g)
		require.Equal(t, events, b.Count(`SELECT count(DISTINCT event_id) FROM test_effects WHERE group_name = $1`, g), "group %s saw %d distinct events", g, events)
		require.Equal(t, events, b.Count(`SELECT count(*) FROM group_inbox WHERE group_name = $1`, g), "group %s's inbox holds every event once", g)
		require.Zero(t, b.Count(`SELECT count(*) FROM group_dead_letters WHERE group_name = $1`, g))
	}
	require.Positive(t, duplicates.Load(), "the event committed without its ack came back and was recognized by beta's inbox")
}

func TestFailingHandlerParksTheEventAfterTheCapAndTheGroupMovesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createEffects(t, b)
	b.RelayStreaming()
	poison := b.Conversation("poison")
	b.Conversation("fine")

	var fixed atomic.Bool
	var poisonCalls atomic.Int64
	settled := make(chan Outcome, 100)
	cfg := b.groupConfig("fragile", func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if ev.ConversationID == poison && !fixed.Load() {
			poisonCalls.Add(1)
			return fmt.Errorf("cannot handle attempt %d", ev.Attempt)
		}
		return recordEffect(ctx, tx, ev)
	})
	cfg.MaxAttempts = 3
	cfg.OnSettled = func(ev Event, o Outcome) {
		if ev.ConversationID == poison {
			settled <- o
		}
	}
	stop := b.startGroup(cfg)

	poisonID := b.Send("poison", "p1", "boom")
	for i := range 3 {
		b.Send("fine", fmt.Sprintf("f%d", i), "ok")
	}
	for i, want := range []Outcome{OutcomeRetry, OutcomeRetry, OutcomeParked} {
		select {
		case got := <-settled:
			require.Equal(t, want, got, "delivery %d of the failing event", i+1)
		case <-time.After(30 * time.Second):
			t.Fatalf("delivery %d of the failing event did not settle within 30s", i+1)
		}
	}
	require.EqualValues(t, 3, poisonCalls.Load(), "the handler ran once per attempt, up to the cap")

	dead, err := DeadLetters(context.Background(), b.DB.Pool, "fragile", false)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, fmt.Sprintf("outbox-%d", poisonID), dead[0].EventID)
	require.Equal(t, 3, dead[0].Attempts)
	require.Contains(t, dead[0].Error, "cannot handle attempt 3")
	require.Nil(t, dead[0].ResolvedAt)
	applied, err := Applied(context.Background(), b.DB.Pool, "fragile", dead[0].EventID)
	require.NoError(t, err)
	require.False(t, applied, "a parked event is not in the inbox, so a replay can apply it")

	// The group moved on: the other events, and one sent after the
	// parking, are applied, and nothing is left unacknowledged.
	b.Send("fine", "f-after", "ok")
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM test_effects WHERE group_name = 'fragile'`) == 4
	}, "the four good events are applied")
	b.ConsumerSettled("fragile", 30*time.Second)
	require.EqualValues(t, 3, poisonCalls.Load(), "a parked event is not delivered again")
	require.NoError(t, stop())

	// Once the handler is fixed, a replay applies the parked event and
	// resolves its dead letter; the events applied before are skipped.
	fixed.Store(true)
	g, err := New(cfg, b.DB.Pool, b.JS)
	require.NoError(t, err)
	res, err := Replay(context.Background(), ReplayConfig{JetStream: b.JS, Stream: b.Stream, Group: "fragile", From: Position{All: true}, Runner: g, ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 5, res.Total)
	require.Equal(t, 5, b.Count(`SELECT count(*) FROM test_effects WHERE group_name = 'fragile'`), "only the parked event was applied by the replay")
	dead, err = DeadLetters(context.Background(), b.DB.Pool, "fragile", true)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.NotNil(t, dead[0].ResolvedAt, "applying a parked event resolves its dead letter")
}

func TestAuditTableRefusesUpdateDeleteAndTruncate(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO audit_events (group_name, event_id, stream_seq, subject, outbox_id, conversation_id, message_id, reason, outbox_created_at, published_at)
		VALUES ('audit', 'outbox-1', 1, 's', 1, 'c', 'm', 'insert', now(), now())`)
	require.NoError(t, err)
	for _, stmt := range []string{
		`UPDATE audit_events SET reason = 'sweep'`,
		`DELETE FROM audit_events`,
		`TRUNCATE audit_events`,
	} {
		_, err := db.Pool.Exec(ctx, stmt)
		require.ErrorContains(t, err, "append-only", "%s must fail", stmt)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE reason = 'insert'`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestGroupRejoinsItsDeletedDurableAndAStreamRecreatedEmpty: a group whose
// durable is deleted, or whose stream comes back empty (every NATS node's
// store lost), creates its durable again and applies the events published
// afterwards, as the turn runner does.
func TestGroupRejoinsItsDeletedDurableAndAStreamRecreatedEmpty(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, b *bundle)
	}{
		{"durable deleted", func(t *testing.T, b *bundle) {
			require.NoError(t, b.JS.DeleteConsumer(context.Background(), b.Stream.Name, "rejoiner"))
		}},
		{"stream recreated empty", func(t *testing.T, b *bundle) {
			ctx := context.Background()
			require.NoError(t, b.JS.DeleteStream(ctx, b.Stream.Name))
			_, _, err := batonnats.ProvisionStream(ctx, b.JS, b.Stream, batonnats.ProvisionOptions{})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			createEffects(t, b)
			b.RelayStreaming()
			rejoined := make(chan struct{}, 1)
			cfg := b.groupConfig("rejoiner", recordEffect)
			cfg.CheckInterval = 200 * time.Millisecond
			cfg.OnRejoin = func() { rejoined <- struct{}{} }
			b.startGroup(cfg)

			b.SendMany(3, 1, "before")
			b.Eventually(30*time.Second, func() bool {
				return b.Count(`SELECT count(*) FROM test_effects`) == 3
			}, "the group applies the events sent before the loss")

			tc.lose(t, b)
			testenv.WaitOrTimeout(t, rejoined, 30*time.Second, "the group rejoins")
			b.SendMany(4, 2, "after")
			b.Eventually(30*time.Second, func() bool {
				return b.Count(`SELECT count(*) FROM test_effects WHERE event_id LIKE 'outbox-%'`) == 7
			}, "the group applies the events sent after it rejoined")
			require.Equal(t, 7, b.Count(`SELECT count(DISTINCT outbox_id) FROM test_effects`), "each event once")
		})
	}
}
