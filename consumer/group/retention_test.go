package group

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/schema"
)

// startTurns runs the turn runner (echo agent, directives on, two attempts
// a turn) until the test ends.
func (b *bundle) startTurns() {
	b.T.Helper()
	w, err := consumer.New(consumer.Config{
		Stream: b.Stream, Agent: consumer.Echo{Directives: true},
		Lease: 2 * time.Second, Debounce: consumer.NoDebounce, MaxAttempts: 2,
		BusyDelay: 50 * time.Millisecond, RetryDelay: 50 * time.Millisecond,
		RecoveryInterval: 500 * time.Millisecond, ShutdownTimeout: 3 * time.Second,
	}, b.DB.Pool, b.JS)
	require.NoError(b.T, err)
	outboxtest.RunInBackground(b.T, "worker", w.Run)
}

// settledTurns waits until every outbox row is done or error, every event
// committed so far is published and the turn runner and the audit group
// have acknowledged all of them. An announcement committed before a row's
// last change may still be on its way through the relay when the row is
// final, so a marker follows: the relay publishes in commit order, and
// once the audit group applied the marker and holds nothing
// unacknowledged, it has every earlier event too.
func (b *bundle) settledTurns(marker string) {
	b.T.Helper()
	final := func() {
		b.Eventually(60*time.Second, func() bool {
			return b.Count(`SELECT count(*) FROM agent_outbox WHERE status NOT IN ('done', 'error')`) == 0
		}, "outbox rows are all done or error")
	}
	final()
	b.Conversation(marker)
	id := b.Send(marker, marker, "marker")
	b.Eventually(60*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM group_inbox WHERE group_name = $1 AND outbox_id = $2`, AuditGroup, id) == 1
	}, "the audit group applied the marker %s", marker)
	final()
	b.ConsumerSettled("turns", 30*time.Second)
	b.ConsumerSettled(AuditGroup, 30*time.Second)
}

// messagesOf lists every message of the database, in order: what a
// conversation's history is.
func messagesOf(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.DB.Pool.Query(context.Background(), `SELECT conversation_id, seq, id, role, content FROM messages ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var conv, id, role, content string
		var seq int64
		require.NoError(t, rows.Scan(&conv, &seq, &id, &role, &content))
		out = append(out, fmt.Sprintf("%s %d %s %s %q", conv, seq, id, role, content))
	}
	require.NoError(t, rows.Err())
	return out
}

func TestPruneKeepsWhatTheRulesKeepAndAReplayOfTheRetainedEventsAppliesNothingTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.RelayStreaming()
	ctx := context.Background()
	b.startTurns()
	b.startGroup(b.groupConfig(AuditGroup, Audit))

	// Phase one: turns of every kind. A plain reply; a reply with a tool
	// call (its operation belongs to the reply); a turn that fails twice
	// after a read (the first run's operation belongs to no message, the
	// second's to the visible error); a failure the conversation moved
	// past; a failure after a write (at once, its operation with the
	// error).
	for _, c := range []struct{ conv, content string }{
		{"plain", "hello"}, {"tools", "/tool lookup abc"}, {"failing", "/tool lookup x\n/fail"},
		{"moved-on", "/fail"}, {"write", "/tool notify z\n/fail"},
	} {
		b.Conversation(c.conv)
		b.Send(c.conv, c.conv+"-1", c.content)
	}
	b.settledTurns("marker-1")
	b.Send("moved-on", "moved-on-2", "hello again")
	b.settledTurns("marker-2")
	// A turn that a newer message superseded after a read leaves its
	// operation to no message (a turn's retries go on from its journal,
	// whose operations its reply or error takes).
	_, err := b.DB.Pool.Exec(ctx, `
		INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, status, lease_expires_at, finished_at)
		VALUES ('run_superseded', $1, 'turn_superseded', '{}', 'w', 'superseded', now(), now())`, b.Key("plain"))
	require.NoError(t, err)
	_, err = b.DB.Pool.Exec(ctx, `
		INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, effect, status, turn_id, epoch, step)
		VALUES ('run_superseded', $1, 'call_1', 'lookup', 'read', 'completed', 'turn_superseded', 0, 0)`, b.Key("plain"))
	require.NoError(t, err)

	// The console's record of an operator's actions, one older than the
	// retention and one young.
	_, err = b.DB.Pool.Exec(ctx, `
		INSERT INTO operator_actions (at, operator, role, action, target) VALUES
			(now() - interval '1 hour', 'ops', 'admin', 'view_conversation', $1),
			(now() + interval '1 hour', 'ops', 'admin', 'view_conversation', $1)`, b.Key("plain"))
	require.NoError(t, err)

	const retention = 3 * time.Second
	ret := schema.Retention{Outbox: retention, Runs: retention, Operations: retention, OperatorActions: retention, InboxMargin: time.Millisecond, Batch: 2}

	// Phase one ages past the retention; the stream then holds only what
	// comes after it, as if its max age had passed.
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs WHERE coalesce(finished_at, started_at) > now() - make_interval(secs => $1)`, (retention+time.Second).Seconds()) == 0
	}, "phase one is older than the retention")
	stream, err := b.JS.Stream(ctx, b.Stream.Name)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	floorSeq := info.State.LastSeq + 1

	// Phase two: young rows, which every rule keeps.
	b.Conversation("young")
	b.Send("young", "young-1", "/tool lookup fresh")
	b.Send("young", "young-2", "/fail")
	b.settledTurns("marker-3")
	require.NoError(t, stream.Purge(ctx, jetstream.WithPurgeSequence(floorSeq)))
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, floorSeq, info.State.FirstSeq)
	floor := schema.StreamFloor{Stream: b.Stream.Name, FirstSeq: info.State.FirstSeq, FirstTime: info.State.FirstTime, Created: info.Created, Outbox: true}

	history := messagesOf(t, b)
	auditRows := b.Count(`SELECT count(*) FROM audit_events`)
	attachedOps := b.Count(`SELECT count(*) FROM operations WHERE message_id IS NOT NULL`)
	retainedInbox := b.Count(`SELECT count(*) FROM group_inbox WHERE stream_seq >= $1`, int64(floorSeq))
	require.Positive(t, retainedInbox)
	require.Positive(t, b.Count(`SELECT count(*) FROM group_inbox WHERE stream_seq < $1`, int64(floorSeq)))
	require.Zero(t, b.Count(`SELECT count(*) FROM group_inbox WHERE stream IS DISTINCT FROM $1`, b.Stream.Name), "inbox rows name their stream")

	dry, err := schema.PruneDryRun(ctx, b.DB.Pool, ret, []schema.StreamFloor{floor})
	require.NoError(t, err)
	var before time.Time
	require.NoError(t, b.DB.Pool.QueryRow(ctx, `SELECT now()`).Scan(&before))
	res, err := schema.Prune(ctx, b.DB.Pool, ret, []schema.StreamFloor{floor}, nil)
	require.NoError(t, err)
	require.True(t, res.CaughtUp)
	require.Equal(t, dry.Rows, res.Rows, "the dry run counts what the pass deletes")
	for _, table := range schema.PrunedTables {
		require.Positive(t, res.Rows[table], "%s: the pass deleted nothing: %v", table, res.Rows)
	}
	cutoff := before.Add(-retention)

	// Outbox: no done row older than the retention; error rows only where
	// the conversation's last word is a visible failure (failing, write);
	// pending and processing rows and young rows untouched.
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'done' AND processed_at < $1`, cutoff))
	var kept []string
	rows, err := b.DB.Pool.Query(ctx, `
		SELECT c.public_id FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id
		WHERE o.status = 'error' AND o.processed_at < $1 ORDER BY 1`, cutoff)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		kept = append(kept, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"failing", "write"}, kept, "old error rows kept only where the conversation shows its failure")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id WHERE c.public_id = 'young'`))

	// Operations: none attached to no message of a run that ended before
	// the cutoff; every operation of a message kept.
	require.Zero(t, b.Count(`
		SELECT count(*) FROM operations o JOIN agent_runs r ON r.id = o.run_id
		WHERE o.message_id IS NULL AND coalesce(r.finished_at, r.started_at) < $1`, cutoff))
	require.Equal(t, attachedOps, b.Count(`SELECT count(*) FROM operations WHERE message_id IS NOT NULL`))

	// Runs: the old ones left are exactly those whose operations belong to
	// a message; none is running.
	require.Zero(t, b.Count(`
		SELECT count(*) FROM agent_runs r WHERE coalesce(r.finished_at, r.started_at) < $1
		AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.run_id = r.id)`, cutoff))
	require.Positive(t, b.Count(`SELECT count(*) FROM agent_runs r WHERE coalesce(r.finished_at, r.started_at) < $1`, cutoff))
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'running'`))

	// Inbox: the events the stream no longer holds are gone from it, every
	// event it still holds is kept.
	require.Zero(t, b.Count(`SELECT count(*) FROM group_inbox WHERE stream_seq < $1`, int64(floorSeq)))
	require.Equal(t, retainedInbox, b.Count(`SELECT count(*) FROM group_inbox`))

	// Operator actions: the old one gone, the young one kept.
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operator_actions WHERE at > now()`))
	require.Zero(t, b.Count(`SELECT count(*) FROM operator_actions WHERE at < $1`, cutoff))

	// Every conversation's messages are intact.
	require.Equal(t, history, messagesOf(t, b))

	// A second pass finds nothing left.
	again, err := schema.Prune(ctx, b.DB.Pool, ret, []schema.StreamFloor{floor}, nil)
	require.NoError(t, err)
	for _, table := range schema.PrunedTables {
		require.Zero(t, again.Rows[table], table)
	}

	// A replay of every retained event applies nothing twice: not in the
	// audit log, not as a turn.
	replayer, err := New(b.groupConfig(AuditGroup, Audit), b.DB.Pool, b.JS)
	require.NoError(t, err)
	rep, err := Replay(ctx, ReplayConfig{JetStream: b.JS, Stream: b.Stream, Group: AuditGroup, From: Position{Seq: 1}, Runner: replayer, ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, floorSeq, rep.FirstSeq, "a replay starts at the stream's first retained event")
	require.Positive(t, rep.Total)
	rep, err = Replay(ctx, ReplayConfig{JetStream: b.JS, Stream: b.Stream, Group: "turns", From: Position{All: true}, ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Positive(t, rep.Total)
	b.settledTurns("marker-4")
	require.Equal(t, auditRows+1, b.Count(`SELECT count(*) FROM audit_events`), "the replay appended no audit event")
	require.Zero(t, b.Count(`SELECT count(*) FROM (SELECT event_id FROM audit_events GROUP BY event_id HAVING count(*) > 1) d`))
	require.Equal(t, history, messagesOf(t, b)[:len(history)], "the replay of turns made no second reply")
	require.Len(t, messagesOf(t, b), len(history)+2, "only the marker and its reply are new")
	require.Equal(t, retainedInbox+1, b.Count(`SELECT count(*) FROM group_inbox`))
}

func TestInboxRowsOfAStreamCreatedAgainAreKeptUntilTheirTimeHasPassed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Rows applied from an earlier stream of the same name, whose
	// sequences (1000 and up) mean nothing to the new one; and a row
	// applied from the new stream.
	created := time.Now()
	_, err := b.DB.Pool.Exec(ctx, `
		INSERT INTO group_inbox (group_name, event_id, stream, stream_seq, processed_at) VALUES
			('audit', 'outbox-1', $1, 1000, $2::timestamptz - interval '2 hours'),
			('audit', 'outbox-2', NULL, 1001, $2::timestamptz - interval '90 minutes'),
			('audit', 'outbox-3', $1, 3, $2::timestamptz + interval '1 second'),
			('audit', 'outbox-4', 'OTHER', 1, $2::timestamptz - interval '2 hours')`, b.Stream.Name, created)
	require.NoError(t, err)
	ret := schema.Retention{InboxMargin: time.Hour}
	pruneWith := func(floor schema.StreamFloor) []string {
		_, err := schema.Prune(ctx, b.DB.Pool, ret, []schema.StreamFloor{floor}, nil)
		require.NoError(t, err)
		rows, err := b.DB.Pool.Query(ctx, `SELECT event_id FROM group_inbox ORDER BY event_id`)
		require.NoError(t, err)
		var left []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			left = append(left, id)
		}
		require.NoError(t, rows.Err())
		sort.Strings(left)
		return left
	}

	// The new stream starts at sequence 2, its oldest event stored two
	// minutes after it was created. By sequence the old rows (1000, 1001)
	// look retained; they were applied before the stream was created, so
	// their sequences say nothing, and by time (more than the margin of an
	// hour before the oldest event) they go. The row without a stream
	// counts as the outbox stream's.
	left := pruneWith(schema.StreamFloor{Stream: b.Stream.Name, FirstSeq: 2, FirstTime: created.Add(2 * time.Minute), Created: created, Outbox: true})
	require.Equal(t, []string{"outbox-3", "outbox-4"}, left,
		"rows of the earlier stream go once their time has passed; the new stream's row (sequence 3, retained) and another stream's row stay")

	// The new stream's row goes only once the stream no longer holds its
	// sequence and it is older than the margin.
	left = pruneWith(schema.StreamFloor{Stream: b.Stream.Name, FirstSeq: 4, FirstTime: created.Add(30 * time.Minute), Created: created, Outbox: true})
	require.Equal(t, []string{"outbox-3", "outbox-4"}, left, "within the margin of the stream's first event: kept")
	left = pruneWith(schema.StreamFloor{Stream: b.Stream.Name, FirstSeq: 3, FirstTime: created.Add(3 * time.Hour), Created: created, Outbox: true})
	require.Equal(t, []string{"outbox-3", "outbox-4"}, left, "its sequence is still held: kept")
	left = pruneWith(schema.StreamFloor{Stream: b.Stream.Name, FirstSeq: 4, FirstTime: created.Add(3 * time.Hour), Created: created, Outbox: true})
	require.Equal(t, []string{"outbox-4"}, left, "its sequence is gone and its time has passed: pruned")
}
