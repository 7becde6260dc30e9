package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestOneReplyPerTurnAcrossThreeWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const conversations, messages = 100, 1000
	for i := range conversations {
		b.Conversation(fmt.Sprintf("conv.%d *>", i))
	}
	for i := range 3 {
		cfg := b.testConfig()
		cfg.Name = fmt.Sprintf("w%d", i)
		cfg.Debounce = 5 * time.Millisecond
		b.startWorker(cfg)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < messages; i += 4 {
				b.Send(fmt.Sprintf("conv.%d *>", i%conversations), fmt.Sprintf("m%d", i), fmt.Sprintf("text %d", i))
			}
		}()
	}
	wg.Wait()
	b.settled(90 * time.Second)

	require.Equal(t, messages, b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'done'`), "every row is done")
	finalized := b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized'`)
	require.Equal(t, finalized, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "one reply per finalized turn")
	require.Zero(t, b.Count(`SELECT count(*) FROM (SELECT turn_id FROM messages WHERE role = 'assistant' GROUP BY turn_id HAVING count(*) > 1) d`), "no turn has two replies")
	require.Equal(t, messages, b.Count(`SELECT count(*) FROM (SELECT DISTINCT unnest(outbox_ids) FROM agent_runs WHERE status = 'finalized') d`), "every row was answered by a finalized turn")
	require.Equal(t, messages, b.Count(`SELECT count(*) FROM (SELECT unnest(outbox_ids) FROM agent_runs WHERE status = 'finalized') d`), "no row was answered twice")
	require.Zero(t, b.Count(`
		SELECT count(*) FROM agent_runs a JOIN agent_runs b
		  ON a.conversation_id = b.conversation_id AND a.id < b.id
		 AND a.started_at < COALESCE(b.finished_at, 'infinity') AND b.started_at < COALESCE(a.finished_at, 'infinity')`),
		"no two runs of one conversation overlapped in time")
	// Each reply echoes exactly its turn's messages.
	rows, err := b.DB.Pool.Query(context.Background(), `
		SELECT m.content, (SELECT string_agg('echo: ' || um.content, E'\n' ORDER BY um.seq)
		                   FROM agent_outbox o JOIN messages um ON um.id = o.message_id WHERE o.id = ANY(r.outbox_ids))
		FROM messages m JOIN agent_runs r ON r.id = m.run_id WHERE m.role = 'assistant'`)
	require.NoError(t, err)
	pairs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Got, Want string }])
	require.NoError(t, err)
	for _, p := range pairs {
		require.Equal(t, p.Want, p.Got)
	}
}

func TestDebounceGathersRapidMessagesIntoOneTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	cfg := b.testConfig()
	cfg.Debounce = DefaultDebounce
	b.startWorker(cfg)
	for i := range 3 {
		b.Send("c", fmt.Sprintf("m%d", i), fmt.Sprintf("part %d", i))
		time.Sleep(10 * time.Millisecond) // the scenario: messages 10 ms apart
	}
	b.settled(20 * time.Second)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized'`), "three messages 10 ms apart make one turn")
	require.Equal(t, 3, b.Count(`SELECT cardinality(outbox_ids) FROM agent_runs WHERE status = 'finalized'`))
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_runs WHERE status NOT IN ('finalized', 'superseded')`), "turns of part of the burst were superseded, never answered")
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_outbox WHERE attempts <> 1`), "a superseded turn is not a failed attempt")
	var reply string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'assistant'`).Scan(&reply))
	require.Equal(t, "echo: part 0\necho: part 1\necho: part 2", reply)
}

func TestMessageDuringATurnBecomesTheNextTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	b.startWorker(b.testConfig())
	first := b.Send("c", "m1", "/sleep 700ms\nfirst")
	b.Eventually(10*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'running'`) == 1
	}, "the first turn is claimed")
	second := b.Send("c", "m2", "second")
	b.settled(20 * time.Second)
	rows, err := b.DB.Pool.Query(context.Background(), `SELECT outbox_ids FROM agent_runs WHERE status = 'finalized' ORDER BY started_at`)
	require.NoError(t, err)
	turns, err := pgx.CollectRows(rows, pgx.RowTo[[]int64])
	require.NoError(t, err)
	require.Equal(t, [][]int64{{first}, {second}}, turns, "the message sent during the turn is the next turn")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
}

// samePartition creates two conversations whose keys share a partition
// and returns their ids.
func (b *bundle) samePartition() (string, string) {
	b.T.Helper()
	slow := "slow"
	want := batonnats.Partition(b.Conversation(slow), b.Stream.Partitions)
	for i := 0; ; i++ {
		fast := fmt.Sprintf("fast-%d", i)
		if batonnats.Partition(b.Conversation(fast), b.Stream.Partitions) == want {
			return slow, fast
		}
	}
}

func TestLongTurnDoesNotDelayAnotherConversation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow, fast := b.samePartition()
	b.Conversation("warmup")
	cfg := b.testConfig()
	cfg.Concurrency = 4
	b.startWorker(cfg)
	// The first turn pays for connections and the consumer's first fetch.
	b.Send("warmup", "w", "hello")
	b.settled(10 * time.Second)

	b.Send(slow, "s", "/sleep 5s\nslow")
	b.Eventually(10*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs WHERE conversation_id = $1 AND status = 'running'`, b.Key(slow)) == 1
	}, "the slow turn runs")
	start := time.Now()
	b.Send(fast, "f", "fast")
	b.Eventually(5*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, b.Key(fast)) == 1
	}, "the fast conversation is answered while the slow one sleeps")
	elapsed := time.Since(start)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_runs WHERE conversation_id = $1 AND status = 'running'`, b.Key(slow)), "the slow turn was still running")
	var latency time.Duration
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `
		SELECT r.created_at - u.created_at FROM messages r, messages u WHERE r.conversation_id = $1 AND r.role = 'assistant' AND u.public_id = 'f'`, b.Key(fast)).Scan(&latency))
	// Speed is for benchmarks; what this proves is the order: the fast
	// conversation was answered while the slow turn still ran.
	t.Logf("insert to reply in the fast conversation: %s (observed %s)", latency, elapsed)
}

func TestDuplicateTriggersAndReannouncementsMakeOneReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Conversation("c")
	b.startWorker(b.testConfig())
	id := b.Send("c", "m1", "hello")
	b.settled(10 * time.Second)

	// The same trigger delivered again (a copy JetStream's duplicate
	// window does not catch), and a re-announcement after the reply.
	trigger := batonnats.Trigger{OutboxID: id, ConversationID: b.Key("c"), MessageID: "m1", Reason: batonnats.ReasonInsert}
	msg, err := trigger.Msg(b.Stream.SubjectPrefix, b.Stream.Partitions)
	require.NoError(t, err)
	msg.Header.Set(batonnats.HeaderMsgID, "copy-of-outbox-1")
	_, err = b.JS.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonSweep, []int64{id})
	}))
	b.Eventually(10*time.Second, func() bool {
		ci, err := b.JS.Consumer(ctx, b.Stream.Name, DefaultConsumerName)
		if err != nil {
			return false
		}
		info, err := ci.Info(ctx)
		return err == nil && info.Delivered.Stream >= 3 && info.NumAckPending == 0 && info.NumPending == 0
	}, "the copy and the re-announcement are delivered and acked")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "one reply")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_runs`), "no second run")
}

func TestFailingEveryAttemptEndsInOneVisibleError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	var st events
	cfg := b.testConfig()
	cfg.OnConversationEvent = st.record
	b.startWorker(cfg)
	b.Send("c", "m1", "/fail")
	b.settled(30 * time.Second)
	require.Equal(t, []string{"error"}, []string{b.statusOf("m1")})
	require.Equal(t, DefaultMaxAttempts, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'failed'`), "every attempt is recorded")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`), "one visible error")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
	var content string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'error'`).Scan(&content))
	require.Contains(t, content, "after 3 attempts")
	require.True(t, st.has(b.Key("c"), batonnats.EventFailed))
}

func (b *bundle) statusOf(messageID string) string {
	b.T.Helper()
	var s string
	require.NoError(b.T, b.DB.Pool.QueryRow(context.Background(), `SELECT o.status FROM agent_outbox o JOIN messages m ON m.id = o.message_id WHERE m.public_id = $1`, messageID).Scan(&s))
	return s
}

func TestDeletingTheConversationDuringATurnCancelsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Conversation("c")
	var st events
	cfg := b.testConfig()
	cfg.OnConversationEvent = st.record
	b.startWorker(cfg)
	b.Send("c", "m1", "/sleep 1500ms\nhello")
	b.Eventually(10*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'running'`) == 1
	}, "the turn runs")
	_, err := schema.DeleteConversation(ctx, b.DB.Pool, b.Owner, "c")
	require.NoError(t, err)
	st.wait(t, 10*time.Second, b.Key("c"), batonnats.EventCancelled)
	b.settled(10 * time.Second)
	require.Zero(t, b.Count(`SELECT count(*) FROM conversations`), "nothing is recreated")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages`), "no reply, no error")
	require.False(t, st.has(b.Key("c"), batonnats.EventFailed))
}

func TestTwoWorkersRecoverAnExpiredRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const runs = 20
	for i := range runs {
		c := fmt.Sprintf("c%d", i)
		b.Conversation(c)
		b.Send(c, c+"-m", "hello")
		require.NoError(t, pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
			_, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: b.Key(c), RunID: c + "-dead", Worker: "dead", Lease: time.Minute, MaxAttempts: 3})
			return err
		}))
	}
	_, err := b.DB.Pool.Exec(ctx, `UPDATE conversations SET lease_expires_at = now() - interval '1 second' WHERE run_id IS NOT NULL`)
	require.NoError(t, err)

	var st events
	workers := make([]*Worker, 2)
	for i := range workers {
		cfg := b.testConfig()
		cfg.OnConversationEvent = st.record
		workers[i], err = New(cfg, b.DB.Pool, b.JS)
		require.NoError(t, err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, len(workers))
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = w.recoverExpired(ctx)
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Len(t, st.all, runs, "each expired run is recovered exactly once")
	require.Equal(t, runs, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'recovered'`))
	require.Equal(t, runs, b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'pending' AND attempts = 1`))

	// The announcements committed with the recovery bring a worker to
	// finish every turn once.
	b.startWorker(b.testConfig())
	b.settled(20 * time.Second)
	require.Equal(t, runs, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
}

func TestEchoRepliesWithToolResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	b.startWorker(b.testConfig())
	b.Send("c", "m1", "look\n/tool lookup abc\n/tool notify ping")
	b.settled(10 * time.Second)
	var reply string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'assistant'`).Scan(&reply))
	require.True(t, strings.Contains(reply, `[lookup: "abc" has 3 characters]`) && strings.Contains(reply, "[notify: notified]") && strings.HasSuffix(reply, "echo: look"), reply)
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM operations WHERE status = 'completed' AND message_id = (SELECT id FROM messages WHERE role = 'assistant')`), "operations are attached to the reply")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations WHERE effect = 'write' AND idempotency_key IS NOT NULL`))
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM tool_side_effects`))
}

// TestAThousandPendingMessagesAreAnsweredInCappedTurnsInOrder: a turn
// carries at most MaxTurnMessages; a conversation with 1,000 pending
// messages is answered in turns of at most that many, oldest first, none
// lost, none twice.
func TestAThousandPendingMessagesAreAnsweredInCappedTurnsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.SendMany(1000, 1, "backlog") // all in conversation "backlog.0"
	cfg := b.testConfig()
	cfg.MaxTurnMessages = 64
	b.startWorker(cfg)
	b.settled(120 * time.Second)

	rows, err := b.DB.Pool.Query(context.Background(), `SELECT outbox_ids FROM agent_runs WHERE status = 'finalized' ORDER BY started_at`)
	require.NoError(t, err)
	turns, err := pgx.CollectRows(rows, pgx.RowTo[[]int64])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(turns), 1000/64+1, "the backlog takes several turns")
	var answered []int64
	for i, turn := range turns {
		require.LessOrEqual(t, len(turn), 64, "turn %d carries at most the cap", i)
		answered = append(answered, turn...)
	}
	require.Equal(t, ids, answered, "every message answered once, in order")
	require.Equal(t, len(turns), b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_runs WHERE status <> 'finalized'`), "no failed or abandoned run")
}

// TestATurnPastItsDeadlineFailsVisibly: a turn that runs past TurnTimeout
// is a failed attempt like any other, and at the cap a visible error.
func TestATurnPastItsDeadlineFailsVisibly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Conversation("c")
	var st events
	cfg := b.testConfig()
	cfg.TurnTimeout = 300 * time.Millisecond
	cfg.MaxAttempts = 2
	cfg.OnConversationEvent = st.record
	b.startWorker(cfg)
	b.Send("c", "m1", "/sleep 1h\nnever")
	st.wait(t, 30*time.Second, b.Key("c"), batonnats.EventFailed)
	b.settled(10 * time.Second)
	require.Equal(t, "error", b.statusOf("m1"))
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'failed' AND error LIKE '%past its deadline%'`), "each attempt ran into the deadline")
	var content, detail string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content, detail FROM messages WHERE role = 'error'`).Scan(&content, &detail))
	require.Contains(t, content, "could not answer after 2 attempts")
	require.Contains(t, detail, "the turn ran past its deadline of 300ms")
}

// TestBurstsGetOneReplyEachAndAWriteIsNeverRepeated: with the default
// quiet window, every burst of three messages 10 ms apart, in twenty
// conversations at once, ends in exactly one reply covering all three, in
// order; turns answering part of a burst were superseded, never shown. A
// turn that started a write is not superseded: its side effect happens
// once, and the rest of its burst is the next turn.
func TestBurstsGetOneReplyEachAndAWriteIsNeverRepeated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.testConfig()
	cfg.Debounce = DefaultDebounce
	cfg.Agent = Echo{Directives: true}
	b.startWorker(cfg)
	const conversations = 20
	var wg sync.WaitGroup
	for c := range conversations {
		id := fmt.Sprintf("burst-%d", c)
		b.Conversation(id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 {
				b.Send(id, fmt.Sprintf("%s-m%d", id, i), fmt.Sprintf("part %d", i))
				time.Sleep(10 * time.Millisecond) // the scenario: messages 10 ms apart
			}
		}()
	}
	wg.Wait()
	b.settled(60 * time.Second)
	for c := range conversations {
		key := b.Key(fmt.Sprintf("burst-%d", c))
		var replies []string
		rows, err := b.DB.Pool.Query(context.Background(), `SELECT content FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, key)
		require.NoError(t, err)
		replies, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"echo: part 0\necho: part 1\necho: part 2"}, replies, "conversation %d: one reply covering the whole burst", c)
	}
	superseded := b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'superseded'`)
	t.Logf("%d bursts, %d superseded turns: %.2f extra model calls per burst", conversations, superseded, float64(superseded)/conversations)

	// A write started: the turn keeps its reply, the side effect is not
	// repeated, and the rest of the burst is the next turn.
	b.Conversation("writer")
	b.Send("writer", "w0", "/tool notify once\nfirst")
	b.Send("writer", "w1", "second")
	b.settled(30 * time.Second)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM tool_side_effects WHERE payload = 'once'`), "the side effect happened once")
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_runs WHERE conversation_id = $1 AND status = 'superseded' AND id IN (SELECT run_id FROM operations WHERE effect = 'write')`, b.Key("writer")),
		"a run that started a write is never superseded")
	require.Zero(t, b.Count(`SELECT count(*) FROM agent_outbox WHERE status <> 'done'`))
}

// TestATriggerOfARowThatNeverExistsDoesNotSupersedeForever: a trigger
// whose row the claim cannot take (here one that will never exist, as
// when its commit died with a primary after the relay published it) is
// no newer message. It must not supersede the turn that answers the real
// message beside it, again and again: the turn replies once, and the
// phantom trigger is acknowledged by the next, empty claim.
func TestATriggerOfARowThatNeverExistsDoesNotSupersedeForever(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Conversation("c")
	cfg := b.testConfig()
	cfg.Debounce = DefaultDebounce
	// The model call lasts long enough for the turn to see the phantom
	// trigger waiting in its mailbox.
	cfg.Agent = slowEcho{delay: time.Second}
	b.startWorker(cfg)

	// The real message first, so that its turn runs when the phantom
	// trigger arrives.
	b.Send("c", "m1", "hello")
	publishPhantom := func(copyID string) {
		phantom := batonnats.Trigger{OutboxID: 1 << 40, ConversationID: b.Key("c"), MessageID: "never", Reason: batonnats.ReasonInsert}
		msg, err := phantom.Msg(b.Stream.SubjectPrefix, b.Stream.Partitions)
		require.NoError(t, err)
		msg.Header.Set(batonnats.HeaderMsgID, copyID)
		_, err = b.JS.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	superseded := func() int { return b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'superseded'`) }
	b.Eventually(10*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'processing'`) == 1
	}, "the message's turn runs")
	publishPhantom("phantom")
	// Arriving during the turn, the phantom looks like a newer message
	// once; the claim after that sees it and takes no row for it.
	b.Eventually(10*time.Second, func() bool { return superseded() >= 1 }, "the phantom supersedes the first turn")
	// Another copy of it (a redelivery, a re-announcement) arrives during
	// the next turn: it is still no newer message.
	publishPhantom("phantom-copy")

	b.settled(30 * time.Second)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "one reply")
	require.Equal(t, 1, superseded(), "the phantom trigger supersedes no turn after a claim saw it")
}

// slowEcho is the echo agent with a model call that takes delay.
type slowEcho struct{ delay time.Duration }

func (s slowEcho) Step(ctx context.Context, req StepRequest) (Step, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return Step{}, context.Cause(ctx)
	}
	return Echo{}.Step(ctx, req)
}
