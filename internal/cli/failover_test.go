package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// TestFailoverToThePromotedStandbyAnswersEveryAcknowledgedMessageOnce runs
// `baton relay` and `baton worker` on a multi-host URL (target_session_attrs=read-write) over a primary and its synchronous
// standby, posts messages steadily, kills the primary (SIGKILL of every
// server process) and promotes the standby. Every message whose commit was
// acknowledged is answered exactly once; the relay streams from the
// promoted standby, where it recreates its slot (a PostgreSQL 15 standby
// has no copy of the primary's logical slots) and announces the pending
// rows again; `baton status` shows the new slot on the new primary.
//
// The relay lags at the moment of the kill, as it may: the WAL sender that
// serves it on the primary is paused (SIGSTOP) while messages go to
// conversations of their own, and dies with the primary. Those messages
// were committed on the old primary and never sent to the relay; its sweep
// runs once an hour and no later message touches their conversations, so
// only the announcement of the recreated slot can answer them.
func TestFailoverToThePromotedStandbyAnswersEveryAcknowledgedMessageOnce(t *testing.T) {
	t.Parallel()
	ha := testenv.PrimaryWithStandby(t, testenv.HAOptions{Synchronous: true})
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	ctx := context.Background()
	const slot = "failover"
	args := func(a ...string) []string { return append(a, "--database-url", ha.DB.URL, "--nats-url", ns.URL) }

	_, u, err := schema.CreateToken(ctx, ha.DB.Pool, "failover")
	require.NoError(t, err)
	const conversations = 8
	for i := range conversations {
		_, _, err := schema.CreateConversation(ctx, ha.DB.Pool, u.ID, fmt.Sprint("c", i), "")
		require.NoError(t, err)
	}

	stopRelay := start(t, args("relay", "--slot", slot, "--heartbeat", "200ms", "--status-interval", "200ms",
		"--sweep-interval", "1h", "--sweep-age", "1h")...)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return testenv.Count(t, ha.DB.Pool, `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = $1`, slot) == 1
	}, "baton relay streams from slot %s on the primary (it provisioned the stream before)", slot)
	start(t, args("worker", "--debounce", "0", "--lease", "3s")...)

	p := &steadyProducer{pool: ha.DB, owner: u.ID, conversations: conversations}
	p.start(t, 20*time.Millisecond)
	answered := func() int {
		var n int
		if err := ha.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM agent_outbox WHERE status = 'done'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return answered() >= 30 }, "30 messages answered before the failover")

	// The relay lags: messages committed now reach no trigger before the
	// primary dies.
	var walSender int
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `
		SELECT r.pid FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
		WHERE s.slot_name = $1`, slot).Scan(&walSender))
	require.NoError(t, syscall.Kill(walSender, syscall.SIGSTOP))
	testenv.Eventually(t, 10*time.Second, func() bool { return processStopped(walSender) }, "the relay's WAL sender (pid %d) is stopped", walSender)
	const orphans = 4
	var orphaned []string
	for i := range orphans {
		id := fmt.Sprint("orphan-m", i)
		_, _, err := schema.CreateConversation(ctx, ha.DB.Pool, u.ID, fmt.Sprint("orphan-", i), "")
		require.NoError(t, err)
		err = pgx.BeginFunc(ctx, ha.DB.Pool, func(tx pgx.Tx) error {
			_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: u.ID, ConversationID: fmt.Sprint("orphan-", i), MessageID: id, Content: "hello"})
			return err
		})
		require.NoError(t, err)
		orphaned = append(orphaned, id)
	}

	killed := time.Now()
	ackedBefore := p.acknowledged()
	ha.Failover(t)
	failedOver := time.Now()

	// The first turn on the promoted standby: finalized after Failover
	// returned, when the old primary was dead for sure (a turn finalized
	// there in the moment between the kill's start and its end would
	// count otherwise). Then the relay streaming from its new slot, and the
	// first answer to a message posted after the failover, which only the
	// recreated slot can have announced.
	var firstTurn time.Time
	testenv.Eventually(t, 30*time.Second, func() bool {
		var at *time.Time
		err := ha.DB.Pool.QueryRow(ctx, `SELECT min(finished_at) FROM agent_runs WHERE status = 'finalized' AND finished_at > $1`, failedOver).Scan(&at)
		if err != nil || at == nil {
			return false
		}
		firstTurn = *at
		return true
	}, "a turn finalized on the promoted standby")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return testenv.Count(t, ha.DB.Pool, `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = $1`, slot) == 1
	}, "baton relay streams from slot %s on the promoted standby", slot)
	relayBack := time.Since(killed)
	afterFailover := p.acknowledgedSince(failedOver)
	testenv.Eventually(t, 30*time.Second, func() bool {
		ids := afterFailover()
		return len(ids) > 0 && testenv.Count(t, ha.DB.Pool, `
			SELECT count(*) FROM agent_outbox o JOIN messages m ON m.id = o.message_id
			WHERE m.public_id = ANY($1) AND o.status = 'done'`, ids) > 0
	}, "a message posted after the failover is answered")
	firstNew := time.Since(killed)
	// Steady posting goes on for a while on the new primary.
	testenv.Eventually(t, 30*time.Second, func() bool { return len(afterFailover()) >= 20 }, "20 messages acknowledged after the failover")
	p.stop()

	acked := p.acknowledged()
	require.Greater(t, len(acked), len(ackedBefore))
	testenv.Eventually(t, 45*time.Second, func() bool {
		return testenv.Count(t, ha.DB.Pool, `SELECT count(*) FROM agent_outbox WHERE status <> 'done'`) == 0
	}, "every outbox row on the promoted standby is answered")
	testenv.Eventually(t, 30*time.Second, func() bool {
		c, err := js.Consumer(ctx, batonnats.DefaultStream, batonnats.DefaultConsumer)
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	}, "the worker acked every trigger")

	// Every acknowledged message is there, answered by exactly one
	// finalized turn with its one reply, and nothing failed.
	acked = append(acked, orphaned...)
	require.Equal(t, len(acked), testenv.Count(t, ha.DB.Pool, `SELECT count(*) FROM messages WHERE role = 'user' AND public_id = ANY($1)`, acked),
		"every message whose commit was acknowledged survived the failover")
	require.Equal(t, orphans, testenv.Count(t, ha.DB.Pool, `
		SELECT count(*) FROM agent_outbox o JOIN messages m ON m.id = o.message_id
		WHERE m.public_id = ANY($1) AND o.status = 'done'`, orphaned), "the messages the relay never published are answered")
	require.Zero(t, testenv.Count(t, ha.DB.Pool, `
		SELECT count(*) FROM (
			SELECT o.id FROM agent_outbox o LEFT JOIN agent_runs r ON r.status = 'finalized' AND o.id = ANY(r.outbox_ids)
			GROUP BY o.id HAVING count(r.id) <> 1) x`), "each message is answered by exactly one finalized turn")
	require.Equal(t, testenv.Count(t, ha.DB.Pool, `SELECT count(*) FROM agent_runs WHERE status = 'finalized'`),
		testenv.Count(t, ha.DB.Pool, `SELECT count(*) FROM messages WHERE role = 'assistant'`), "one reply per finalized turn")
	require.Zero(t, testenv.Count(t, ha.DB.Pool, `
		SELECT count(*) FROM agent_runs r LEFT JOIN messages m ON m.id = r.reply_message_id
		WHERE r.status = 'finalized' AND (m.id IS NULL OR m.role <> 'assistant')`), "every finalized turn has its reply")
	require.Zero(t, testenv.Count(t, ha.DB.Pool, `SELECT count(*) FROM messages WHERE role = 'error'`), "no turn failed")

	// The relay streams from the promoted standby, from a slot it made
	// there.
	out, stderr, code := run(t, args("status", "--json", "--slot", slot, "--max-pending-age", "1h")...)
	require.Equal(t, 0, code, "baton status after the failover: %s %s", out, stderr)
	var rep struct {
		Database struct {
			Server   string `json:"server"`
			Timeline int    `json:"timeline"`
		} `json:"database"`
		Slot struct {
			Exists bool   `json:"exists"`
			Active bool   `json:"active"`
			Client string `json:"client"`
		} `json:"slot"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, "127.0.0.1:"+strconv.Itoa(ha.Standby.Port()), rep.Database.Server, "status reads the promoted standby")
	require.Equal(t, 2, rep.Database.Timeline, "the promotion started timeline 2")
	require.True(t, rep.Slot.Exists && rep.Slot.Active, "the slot exists and is read on the promoted standby: %s", out)
	require.Contains(t, rep.Slot.Client, "baton-relay")
	text, _, code := run(t, args("status", "--slot", slot, "--max-pending-age", "1h")...)
	require.Equal(t, 0, code, text)
	require.Contains(t, text, slot)
	require.Contains(t, text, "127.0.0.1:"+strconv.Itoa(ha.Standby.Port()))

	code, logs := stopRelay()
	require.Equal(t, 0, code, logs)
	recreated := ""
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "slot (re)created") {
			recreated = line
		}
	}
	require.Contains(t, recreated, `"cause":"missing"`, "the relay recreated its slot on the promoted standby:\n%s", logs)
	require.Contains(t, recreated, `"rows_announced"`)
	require.NotContains(t, recreated, `"rows_announced":0`)

	t.Logf("%d messages acknowledged (%d before the kill); after the kill: failover done (killed, promoted, reachable) in %s, first turn on the promoted standby in %s, relay streaming from it by %s, first message posted after the failover answered in %s; relay: %s",
		len(acked), len(ackedBefore)+orphans, failedOver.Sub(killed).Round(time.Millisecond), firstTurn.Sub(killed).Round(time.Millisecond),
		relayBack.Round(time.Millisecond), firstNew.Round(time.Millisecond), recreated)
}

// steadyProducer posts a message every interval, round robin over its
// conversations, each with a fresh id that it posts again, as a client
// would, until its commit is acknowledged.
type steadyProducer struct {
	pool          *testenv.DB
	owner         int64
	conversations int

	mu    sync.Mutex
	acked map[string]time.Time
	halt  chan struct{}
	done  chan struct{}
}

func (p *steadyProducer) start(t *testing.T, interval time.Duration) {
	p.acked = map[string]time.Time{}
	p.halt = make(chan struct{})
	p.done = make(chan struct{})
	t.Cleanup(p.stop)
	go func() {
		defer close(p.done)
		ctx := context.Background()
		for i := 0; ; i++ {
			id := fmt.Sprint("m", i)
			for {
				select {
				case <-p.halt:
					return
				default:
				}
				err := pgx.BeginFunc(ctx, p.pool.Pool, func(tx pgx.Tx) error {
					_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{
						OwnerID: p.owner, ConversationID: fmt.Sprint("c", i%p.conversations), MessageID: id, Content: "hello " + id,
					})
					return err
				})
				if err == nil {
					p.mu.Lock()
					p.acked[id] = time.Now()
					p.mu.Unlock()
					break
				}
				// No primary for the moment: post the same id again.
				time.Sleep(interval)
			}
			select {
			case <-p.halt:
				return
			case <-time.After(interval):
			}
		}
	}()
}

func (p *steadyProducer) stop() {
	select {
	case <-p.halt:
	default:
		close(p.halt)
	}
	<-p.done
}

// acknowledged returns the ids of the messages whose commit returned.
func (p *steadyProducer) acknowledged() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.acked))
	for id := range p.acked {
		ids = append(ids, id)
	}
	return ids
}

// acknowledgedSince returns a function listing the messages acknowledged
// after t.
func (p *steadyProducer) acknowledgedSince(t time.Time) func() []string {
	return func() []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var ids []string
		for id, at := range p.acked {
			if at.After(t) {
				ids = append(ids, id)
			}
		}
		return ids
	}
}

// processStopped reports whether the process is stopped by a signal, as
// /proc shows it.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	return strings.HasPrefix(strings.TrimSpace(rest), "T")
}
