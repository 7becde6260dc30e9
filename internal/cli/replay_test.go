package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

var slots atomic.Int64

// outbox is a migrated database, a NATS server and a real relay between
// them, with a user who owns conversations: what `baton group run` and
// `baton replay` work on.
type outbox struct {
	t     *testing.T
	db    *testenv.DB
	nats  *testenv.NATS
	js    jetstream.JetStream
	owner int64
}

func startOutbox(t *testing.T) *outbox {
	t.Helper()
	o := &outbox{t: t, db: testenv.Database(t), nats: testenv.StartNATS(t)}
	nc, js := o.nats.Connect(t)
	o.js = js
	_, u, err := schema.CreateToken(context.Background(), o.db.Pool, "replayer")
	require.NoError(t, err)
	o.owner = u.ID
	r, err := relay.New(relay.Config{
		Slot:          fmt.Sprintf("replay_%d_%d", os.Getpid(), slots.Add(1)),
		SweepInterval: time.Hour,
		SweepAge:      time.Hour,
	}, o.db.Pool, nc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	// Streaming from its slot (held by a WAL sender, not by the backend
	// creating it): every row committed from now on is announced once, and
	// the stream is provisioned.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return testenv.Count(t, o.db.Pool, `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.database = current_database()`) == 1
	}, "the relay streams from its slot")
	return o
}

func (o *outbox) args(args ...string) []string {
	return append(args, "--database-url", o.db.URL, "--nats-url", o.nats.URL)
}

// send commits n user messages over 5 conversations and returns their
// outbox rows.
func (o *outbox) send(prefix string, n int) []int64 {
	o.t.Helper()
	ctx := context.Background()
	for c := range 5 {
		_, _, err := schema.CreateConversation(ctx, o.db.Pool, o.owner, fmt.Sprintf("%s-%d", prefix, c), "")
		require.NoError(o.t, err)
	}
	var ids []int64
	err := pgx.BeginFunc(ctx, o.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		for i := range n {
			res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{
				OwnerID: o.owner, ConversationID: fmt.Sprintf("%s-%d", prefix, i%5), MessageID: fmt.Sprintf("%s-m%d", prefix, i), Content: "hi",
			})
			if err != nil {
				return err
			}
			ids = append(ids, res.OutboxID)
		}
		return nil
	})
	require.NoError(o.t, err)
	return ids
}

// streamHolds waits until the stream's last sequence is seq and returns
// the time the stream stored that message.
func (o *outbox) streamHolds(seq uint64) time.Time {
	o.t.Helper()
	ctx := context.Background()
	testenv.Eventually(o.t, 30*time.Second, func() bool {
		s, err := o.js.Stream(ctx, batonnats.DefaultStream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.LastSeq == seq
	}, "the stream holds %d events", seq)
	s, err := o.js.Stream(ctx, batonnats.DefaultStream)
	require.NoError(o.t, err)
	m, err := s.GetMsg(ctx, seq)
	require.NoError(o.t, err)
	return m.Time
}

func (o *outbox) consumerInfo(name string) *jetstream.ConsumerInfo {
	o.t.Helper()
	c, err := o.js.Consumer(context.Background(), batonnats.DefaultStream, name)
	require.NoError(o.t, err)
	ci, err := c.Info(context.Background())
	require.NoError(o.t, err)
	return ci
}

// auditLog is the audit table as one comparable value.
func (o *outbox) auditLog() string {
	o.t.Helper()
	var s *string
	require.NoError(o.t, o.db.Pool.QueryRow(context.Background(),
		`SELECT string_agg(id || ':' || event_id || ':' || stream_seq, ',' ORDER BY id) FROM audit_events`).Scan(&s))
	if s == nil {
		return ""
	}
	return *s
}

// start runs a long-lived command the way a user would, until the test
// stops it; stop returns its exit code and stderr.
func start(t *testing.T, args ...string) (stop func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var errb bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- cli.Run(ctx, append([]string{"--log-format", "json"}, args...), &bytes.Buffer{}, &errb)
	}()
	stopped := false
	var code int
	stop = func() (int, string) {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err := <-done:
				code = cli.ExitCode(err)
				if err != nil {
					errb.WriteString(err.Error())
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop within 30s", strings.Join(args, " "))
			}
		}
		return code, errb.String()
	}
	t.Cleanup(func() { stop() })
	return stop
}

// requireDeliveredAgain checks that a group whose events were all acked
// received n of them again since began: a consumer reset counts deliveries
// from 1 again, and nothing but the replay delivered anything since.
func requireDeliveredAgain(t *testing.T, ci *jetstream.ConsumerInfo, began time.Time, n int) {
	t.Helper()
	require.GreaterOrEqual(t, ci.Delivered.Consumer, uint64(n), "the replay delivered every event again")
	require.NotNil(t, ci.Delivered.Last)
	require.True(t, ci.Delivered.Last.After(began), "the last delivery came from the replay")
	require.EqualValues(t, n, ci.AckFloor.Stream, "every replayed event was acked again")
}

func TestReplayAllOfAuditAfterItProcessedEverythingLeavesTheAuditTableUnchanged(t *testing.T) {
	t.Parallel()
	o := startOutbox(t)
	const events = 200
	o.send("a", events)

	stop := start(t, o.args("group", "run", "audit", "--lanes", "4")...)
	testenv.Eventually(t, 60*time.Second, func() bool { return testenv.Count(t, o.db.Pool, `SELECT count(*) FROM audit_events`) == events },
		"baton group run audit appended all %d events", events)
	code, stderr := stop()
	require.Equal(t, 0, code, stderr)
	before := o.auditLog()
	ci := o.consumerInfo(group.AuditGroup)
	require.EqualValues(t, events, ci.AckFloor.Stream, "the group acked every event")

	out, stderr, code := run(t, o.args("replay", "--group", "audit", "--all", "--dry-run")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("would replay %d events, stream sequences 1 to %d", events, events))
	require.Contains(t, out, fmt.Sprintf("already holds %d of them (skipped on replay), 0 new", events))
	dry := o.consumerInfo(group.AuditGroup)
	require.Equal(t, ci.Delivered, dry.Delivered, "a dry run moves nothing")
	require.Equal(t, ci.AckFloor, dry.AckFloor, "a dry run moves nothing")

	began := time.Now()
	out, stderr, code = run(t, o.args("replay", "--group", "audit", "--all", "--progress-every", "10ms")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("replayed group audit: %d events, stream sequences 1 to %d", events, events))
	require.Contains(t, out, fmt.Sprintf("replay audit: %d/%d events (100.0%%)", events, events), "plain progress lines when not on a terminal")
	requireDeliveredAgain(t, o.consumerInfo(group.AuditGroup), began, events)
	require.Equal(t, before, o.auditLog(), "the audit table is unchanged: every replayed event was in the inbox")
	require.Equal(t, events, testenv.Count(t, o.db.Pool, `SELECT count(*) FROM group_inbox WHERE group_name = 'audit'`))
}

func TestReplayAtTimeBetweenBatchesAuditsOnlyTheLaterOneThenSinceOneHourAddsTheEarlier(t *testing.T) {
	t.Parallel()
	o := startOutbox(t)
	early := o.send("early", 30)
	lastEarly := o.streamHolds(uint64(len(early)))
	at := lastEarly.Add(time.Microsecond)
	late := o.send("late", 20)
	o.streamHolds(uint64(len(early) + len(late)))

	// A group that never ran, started between the batches.
	out, stderr, code := run(t, o.args("replay", "--group", "audit", "--at", at.Format(time.RFC3339Nano))...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("replayed group audit: %d events, stream sequences %d to %d", len(late), len(early)+1, len(early)+len(late)))
	require.Equal(t, len(late), testenv.Count(t, o.db.Pool, `SELECT count(*) FROM audit_events`))
	require.Equal(t, len(late), testenv.Count(t, o.db.Pool, `SELECT count(*) FROM audit_events WHERE outbox_id = ANY($1)`, late), "exactly the later batch is audited")

	// Every event is younger than an hour: --since 1h covers both
	// batches, and only the earlier one is new to the group.
	out, stderr, code = run(t, o.args("replay", "--group", "audit", "--since", "1h")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("replayed group audit: %d events, stream sequences 1 to %d", len(early)+len(late), len(early)+len(late)))
	require.Equal(t, len(early)+len(late), testenv.Count(t, o.db.Pool, `SELECT count(*) FROM audit_events`), "each event is audited exactly once")
	require.Equal(t, len(early)+len(late), testenv.Count(t, o.db.Pool, `SELECT count(DISTINCT outbox_id) FROM audit_events`))
}

func TestReplayTurnsThroughTheRunningWorkerCreatesNoSecondReply(t *testing.T) {
	t.Parallel()
	o := startOutbox(t)
	_, js := o.nats.Connect(t)
	w, err := consumer.New(consumer.Config{
		Lease: 2 * time.Second, Debounce: consumer.NoDebounce,
		BusyDelay: 50 * time.Millisecond, RetryDelay: 200 * time.Millisecond, ShutdownTimeout: 3 * time.Second,
	}, o.db.Pool, js)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	const messages = 40
	o.send("turns", messages)
	testenv.Eventually(t, 60*time.Second, func() bool {
		return testenv.Count(t, o.db.Pool, `SELECT count(*) FROM agent_outbox WHERE status = 'done'`) == messages
	}, "every message was answered")
	testenv.Eventually(t, 30*time.Second, func() bool {
		ci := o.consumerInfo(batonnats.DefaultConsumer)
		return ci.NumAckPending == 0 && ci.NumPending == 0
	}, "every trigger is acked")
	replies := testenv.Count(t, o.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`)
	runs := testenv.Count(t, o.db.Pool, `SELECT count(*) FROM agent_runs`)
	require.Positive(t, replies)
	began := time.Now()

	// No database: the worker does the work, the replay watches.
	out, stderr, code := run(t, "replay", "--group", "turns", "--all", "--nats-url", o.nats.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, fmt.Sprintf("replayed group turns: %d events", messages))
	requireDeliveredAgain(t, o.consumerInfo(batonnats.DefaultConsumer), began, messages)
	require.Equal(t, replies, testenv.Count(t, o.db.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`), "no second reply")
	require.Equal(t, runs, testenv.Count(t, o.db.Pool, `SELECT count(*) FROM agent_runs`), "replayed triggers found no pending row and claimed nothing")
	require.Zero(t, testenv.Count(t, o.db.Pool, `SELECT count(*) FROM (SELECT turn_id FROM messages WHERE role = 'assistant' GROUP BY turn_id HAVING count(*) > 1) d`))
}

func TestReplayAndGroupRunUsageErrorsNameTheFlag(t *testing.T) {
	_, stderr, code := run(t, "replay", "--group", "audit", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "exactly one of --all, --from-seq N, --since DURATION or --at TIME")

	_, stderr, code = run(t, "replay", "--group", "audit", "--all", "--since", "1h", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "exactly one")

	_, stderr, code = run(t, "replay", "--group", "audit", "--at", "yesterday", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--at")

	_, stderr, code = run(t, "group", "run", "webhook", "--database-url", "postgres://x@127.0.0.1:1/x", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--webhook-url")

	t.Setenv("BATON_WEBHOOK_SECRET", "")
	_, stderr, code = run(t, "group", "run", "webhook", "--webhook-url", "https://example.com/hook", "--database-url", "postgres://x@127.0.0.1:1/x", "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "BATON_WEBHOOK_SECRET")

	_, _, code = run(t, "group", "run", "notifications")
	require.Equal(t, 2, code, "only built-in groups run from the command line")
}

func TestReplayOfAGroupWithoutConsumerSaysHowToStartIt(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	nc, err := natsclient.Connect(ns.URL)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, _, err = batonnats.ProvisionStream(context.Background(), js, batonnats.StreamConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	_, stderr, code := run(t, "replay", "--group", "notifications", "--all", "--nats-url", ns.URL)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "group notifications has no consumer")
}
