package relay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/migrations"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// producer inserts one row at a time until stopped, recording for each
// row the WAL insert position just before its commit: with one producer
// every earlier transaction ends before that position, and the row's own
// transaction ends after it.
type producer struct {
	b    *bundle
	conv string
	mu   sync.Mutex
	ids  []int64
	// inDoubt are rows whose COMMIT failed: a server that went away may
	// have committed them before its answer was lost.
	inDoubt map[int64]bool
	before  map[int64]pglogrepl.LSN
	stop    chan struct{}
	done    chan struct{}
	retries atomic.Int64
}

func startProducer(t *testing.T, b *bundle, conv string, every time.Duration) *producer {
	p := &producer{b: b, conv: conv, inDoubt: map[int64]bool{}, before: map[int64]pglogrepl.LSN{}, stop: make(chan struct{}), done: make(chan struct{})}
	b.conversation(t, conv)
	go func() {
		defer close(p.done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			var id int64
			var lsnText string
			committing := false
			err := func() error {
				tx, err := b.pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: b.owner, ConversationID: conv, MessageID: fmt.Sprintf("%s-%d", conv, i), Content: "hi"})
				if err != nil {
					return err
				}
				id = res.OutboxID
				if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsnText); err != nil {
					return err
				}
				committing = true
				return tx.Commit(ctx)
			}()
			if err != nil {
				// PostgreSQL may be restarting: the row was not committed,
				// or, when COMMIT was sent, perhaps it was; try again.
				p.retries.Add(1)
				if committing {
					p.mu.Lock()
					p.inDoubt[id] = true
					p.mu.Unlock()
				}
				continue
			}
			lsn, _ := pglogrepl.ParseLSN(lsnText)
			p.mu.Lock()
			p.ids = append(p.ids, id)
			p.before[id] = lsn
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.halt)
	return p
}

func (p *producer) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

func (p *producer) waitRows(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return p.count() >= n }, 60*time.Second, 10*time.Millisecond, "the producer did not commit %d rows", n)
}

func TestRelayHoldsTheSlotWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.start(t, b.cfg)
	waitActive(t, r)
	p := startProducer(t, b, "nats down", 5*time.Millisecond)
	p.waitRows(t, 100)
	waitStreamCount(t, b.js, 50, 30*time.Second)

	b.nats.Stop()
	stopped := time.Now()
	// While NATS is down the slot may only confirm what JetStream had
	// acknowledged before it went away.
	var maxConfirmed pglogrepl.LSN
	atStop := p.count()
	for time.Since(stopped) < 10*time.Second {
		maxConfirmed = max(maxConfirmed, slotConfirmed(t, b.pool, b.cfg.Slot))
		time.Sleep(50 * time.Millisecond)
	}
	require.Greater(t, p.count(), atStop+100, "rows kept being committed while NATS was down")
	b.nats.Start()

	p.waitRows(t, p.count()+50)
	p.halt()
	waitStreamCount(t, b.js, p.count(), time.Minute)
	events := streamEvents(t, b.js)
	requireExactlyOnce(t, events, p.ids)

	// The first row JetStream stored after the outage was not acknowledged
	// before it: the slot must not have confirmed its transaction.
	var firstLate int64
	for _, e := range events {
		if e.Stored.After(stopped) && (firstLate == 0 || e.OutboxID < firstLate) {
			firstLate = e.OutboxID
		}
	}
	require.NotZero(t, firstLate, "some rows were committed while NATS was down")
	require.LessOrEqual(t, maxConfirmed, p.before[firstLate],
		"while NATS was down the slot confirmed %s, past row %d (its commit follows %s) which JetStream had not acknowledged", maxConfirmed, firstLate, p.before[firstLate])
}

// ownCluster starts a PostgreSQL cluster for one test, which it may
// restart, with a migrated database.
func ownCluster(t *testing.T, settings map[string]string) (*pgcluster.Cluster, *pgxpool.Pool, string) {
	t.Helper()
	// As root the server runs as postgres, which must reach the folder:
	// t.TempDir's parent is private, so use a folder of its own.
	dir, err := os.MkdirTemp("", "baton-relay-pg-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	c, err := pgcluster.New(pgcluster.Options{Dir: filepath.Join(dir, "data"), Settings: settings})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.Init(ctx))
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(pgcluster.Immediate) })
	url := c.URL("postgres")
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	return c, pool, url
}

func TestRelayResumesAfterPostgresRestarts(t *testing.T) {
	t.Parallel()
	// A crash loses commits that synchronous_commit = off had not yet
	// written; the producer must only count rows that really committed.
	c, pool, url := ownCluster(t, map[string]string{"synchronous_commit": "on"})
	b := setupWith(t, pool, url, "baton_outbox")
	r, _ := b.start(t, b.cfg)
	waitActive(t, r)
	p := startProducer(t, b, "pg restart", 5*time.Millisecond)
	p.waitRows(t, 100)

	require.NoError(t, c.Restart(context.Background(), pgcluster.Immediate))
	restarted := p.count()
	p.waitRows(t, restarted+100)
	p.halt()

	// Every acknowledged row survived the restart; a row whose COMMIT
	// failed may have committed too.
	ids := outboxIDs(t, pool)
	var acknowledged []int64
	for _, id := range ids {
		if !p.inDoubt[id] {
			acknowledged = append(acknowledged, id)
		}
	}
	require.Equal(t, p.ids, acknowledged, "every committed row survived the restart, and no other row but those whose commit was in doubt")
	waitStreamCount(t, b.js, len(ids), time.Minute)
	requireExactlyOnce(t, streamEvents(t, b.js), ids)
	require.Eventually(t, r.active.Load, 30*time.Second, 10*time.Millisecond, "the relay streams again")
}

func TestHeartbeatAdvancesTheSlotWhileTheOutboxIsIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, _ := b.start(t, b.cfg)
	waitActive(t, r)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE busy (id bigserial PRIMARY KEY, payload text)`)
	require.NoError(t, err)

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = b.pool.Exec(ctx, `INSERT INTO busy (payload) SELECT repeat('x', 200) FROM generate_series(1, 50)`)
		}
	}()
	defer func() { close(stop); <-done }()

	// Positions written by the busy table only: nothing of the outbox
	// follows, so only heartbeats can carry the slot past them.
	for range 3 {
		mark := currentLSN(t, b.pool)
		waitConfirmedPast(t, b.pool, b.cfg.Slot, mark, 20*time.Second)
	}
	require.Zero(t, streamCount(b.js), "the outbox stayed idle")
}

func TestSweeperAnnouncesPendingRowsAfterTheStreamIsPurged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.cfg
	cfg.SweepInterval = 200 * time.Millisecond
	cfg.SweepAge = 500 * time.Millisecond
	r, _ := b.start(t, cfg)
	waitActive(t, r)
	b.conversation(t, "purged")
	var ids []int64
	for i := range 20 {
		ids = append(ids, b.insert(t, "purged", fmt.Sprintf("purged-%d", i)))
	}
	waitStreamCount(t, b.js, 20, 30*time.Second)

	// A broker that lost acknowledged events.
	s, err := b.js.Stream(context.Background(), batonnats.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, s.Purge(context.Background()))
	require.Zero(t, streamCount(b.js))

	waitStreamCount(t, b.js, 20, 30*time.Second)
	swept := map[int64]bool{}
	for _, e := range streamEvents(t, b.js) {
		require.Equal(t, string(batonnats.ReasonSweep), e.Reason)
		require.Regexp(t, fmt.Sprintf(`^outbox-%d-s\d+$`, e.OutboxID), e.MsgID, "a sweep is a new announcement, not swallowed by the duplicate window")
		swept[e.OutboxID] = true
	}
	for _, id := range ids {
		require.True(t, swept[id], "row %d was announced again after the purge", id)
	}
}

func TestSweepAnnouncesARowOncePerPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.cfg
	cfg.SweepInterval = time.Minute
	cfg.SweepAge = time.Minute
	cfg.SweepBatch = 7 // several batches in one sweep
	cfg.Logger = testLogger(t)
	r, err := New(cfg, b.pool, b.relayConn(t))
	require.NoError(t, err)
	b.conversation(t, "sweep")
	for i := range 30 {
		b.insert(t, "sweep", fmt.Sprintf("sweep-%d", i))
	}
	ctx := context.Background()
	n, err := r.sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "rows younger than the sweep age are left alone")

	_, err = b.pool.Exec(ctx, `UPDATE agent_outbox SET created_at = now() - interval '2 minutes' WHERE id % 3 <> 0`)
	require.NoError(t, err)
	n, err = r.sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, n, "every pending row older than the sweep age is announced")
	n, err = r.sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a row announced in this period is not announced again")

	_, err = b.pool.Exec(ctx, `UPDATE agent_outbox SET status = 'done', announced_at = now() - interval '2 minutes'`)
	require.NoError(t, err)
	n, err = r.sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "rows that are not pending are never swept")
}

func TestRelayRecreatesAMissingSlotAndAnnouncesPendingRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, stop := b.start(t, b.cfg)
	waitActive(t, r)
	b.conversation(t, "lost")
	first := b.insert(t, "lost", "lost-0")
	waitStreamCount(t, b.js, 1, 30*time.Second)
	stop()

	// Rows committed while the relay is away, then the slot is gone.
	var ids = []int64{first}
	for i := 1; i <= 5; i++ {
		ids = append(ids, b.insert(t, "lost", fmt.Sprintf("lost-%d", i)))
	}
	// The server releases the slot once it notices the relay left.
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, b.cfg.Slot)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "drop the slot")

	cfg := b.cfg
	r2, _ := b.start(t, cfg)
	waitActive(t, r2)
	after := b.insert(t, "lost", "lost-after")
	waitStreamCount(t, b.js, 1+len(ids)+1, 30*time.Second)

	reasons := map[int64][]string{}
	for _, e := range streamEvents(t, b.js) {
		reasons[e.OutboxID] = append(reasons[e.OutboxID], e.Reason)
	}
	for _, id := range ids {
		require.Contains(t, reasons[id], string(batonnats.ReasonSweep), "pending row %d is announced again after the slot was recreated", id)
	}
	require.Equal(t, []string{string(batonnats.ReasonInsert)}, reasons[after], "rows after the new slot arrive as inserts")
}

func TestRelayRecreatesAnInvalidatedSlot(t *testing.T) {
	t.Parallel()
	_, pool, url := ownCluster(t, map[string]string{"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"})
	b := setupWith(t, pool, url, "baton_outbox")
	r, stop := b.start(t, b.cfg)
	waitActive(t, r)
	stop()
	b.conversation(t, "invalidated")
	id := b.insert(t, "invalidated", "invalidated-0")

	// Write and recycle WAL past what the slot may keep.
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, `SELECT pg_switch_wal(); CREATE TEMP TABLE IF NOT EXISTS filler (x text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000); SELECT pg_switch_wal(); CHECKPOINT`)
		require.NoError(t, err)
		var status string
		require.NoError(t, pool.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, b.cfg.Slot).Scan(&status))
		return status == "lost"
	}, 60*time.Second, 10*time.Millisecond, "the slot was not invalidated")

	r2, _ := b.start(t, b.cfg)
	waitActive(t, r2)
	waitStreamCount(t, b.js, 1, 30*time.Second)
	events := streamEvents(t, b.js)
	require.Len(t, events, 1)
	require.Equal(t, id, events[0].OutboxID)
	require.Equal(t, string(batonnats.ReasonSweep), events[0].Reason)
}

func TestAFastPostgresShutdownDoesNotWaitForeverOnTheRelay(t *testing.T) {
	t.Parallel()
	c, pool, url := ownCluster(t, map[string]string{"synchronous_commit": "on"})
	b := setupWith(t, pool, url, "baton_outbox")
	cfg := b.cfg
	// As in production: nothing but keepalives between the relay's own
	// positions, so the end of WAL is confirmed only when the relay takes
	// it from the server.
	cfg.HeartbeatInterval = time.Hour
	cfg.StatusInterval = 10 * time.Second
	r, _ := b.start(t, cfg)
	waitActive(t, r)
	p := startProducer(t, b, "fast stop", 5*time.Millisecond)
	p.waitRows(t, 50)
	p.halt()
	waitStreamCount(t, b.js, len(outboxIDs(t, pool)), time.Minute)

	// A fast shutdown waits until the relay confirms the end of WAL,
	// shutdown checkpoint included; Stop reports a server that had to be
	// killed after 30 seconds.
	require.NoError(t, c.Restart(context.Background(), pgcluster.Fast), "the fast shutdown completed on its own")
	require.Eventually(t, r.active.Load, 30*time.Second, 10*time.Millisecond, "the relay streams again")
}
