package relay

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// The benchmarks run only with -bench, never in the normal test path:
//
//	go test -run '^$' -bench . -benchtime 1x ./relay/

const backlogRows = 200_000

// BenchmarkRelayDrain compares the relay's drain rate for a backlog of
// 200,000 outbox rows with pg_recvlogical's raw decode rate of the same
// WAL, with the same plugin options, through slots created at the same
// position. pg_recvlogical reads the backlog once before the relay and once
// after it, and the faster of its two runs is the reference, so neither the
// order of the runs nor a disturbance during one of them favours the relay.
func BenchmarkRelayDrain(b *testing.B) {
	for range b.N {
		drainOnce(b)
	}
}

func drainOnce(b *testing.B) {
	ctx := context.Background()
	db := testenv.Database(b)
	n := testenv.StartNATS(b)
	_, js := n.Connect(b)
	bb := &bundle{pool: db.Pool, dbURL: db.URL, nats: n, js: js}
	cfg := Config{Slot: "bench_relay_" + db.Name, StatusInterval: time.Second, SweepInterval: time.Hour, SweepAge: time.Hour, HeartbeatInterval: time.Hour}
	r, err := New(cfg, db.Pool, bb.relayConn(b), testLogger(b))
	require.NoError(b, err)
	require.NoError(b, r.ensurePublication(ctx))
	rawSlots := []string{"bench_raw_" + db.Name, "bench_raw2_" + db.Name}
	for _, s := range append([]string{cfg.Slot}, rawSlots...) {
		_, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s)
		require.NoError(b, err)
	}

	_, user, err := schemaUser(ctx, db)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) SELECT 'bench.' || g, 'bench.' || g, $1 FROM generate_series(0, 99) g`, user)
	require.NoError(b, err)
	const perTx = 1000
	for start := 0; start < backlogRows; start += perTx {
		_, err := db.Pool.Exec(ctx, `
			WITH m AS (
				INSERT INTO messages (id, conversation_id, role, content)
				SELECT 'm' || g, 'bench.' || (g % 100), 'user', 'hello'
				FROM generate_series($1::int, $2::int) g
				RETURNING id, conversation_id)
			INSERT INTO agent_outbox (conversation_id, message_id) SELECT conversation_id, id FROM m`, start, start+perTx-1)
		require.NoError(b, err)
	}
	end := currentLSN(b, db.Pool)
	// Settle the server before anything is timed: the WAL flushed (the
	// test cluster commits asynchronously, and a WAL sender sends only
	// flushed WAL), and the tables vacuumed and analyzed, so autovacuum does
	// not wake up in the middle of one run and not the other.
	_, err = db.Pool.Exec(ctx, `VACUUM (ANALYZE) messages, agent_outbox`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(b, err)

	bin, err := pgcluster.FindBinDir()
	require.NoError(b, err)
	recvlogical := func(slot string) time.Duration {
		raw := exec.Command(filepath.Join(bin, "pg_recvlogical"), "-d", db.URL, "--slot", slot, "--start",
			"-o", "proto_version=1", "-o", "publication_names="+r.cfg.Publication, "-o", "messages=true",
			"--endpos", end.String(), "--no-loop", "-f", "/dev/null")
		start := time.Now()
		out, err := raw.CombinedOutput()
		elapsed := time.Since(start)
		require.NoError(b, err, "pg_recvlogical: %s", out)
		return elapsed
	}
	b.ResetTimer()
	rawBefore := recvlogical(rawSlots[0])

	var acked atomic.Int64
	done := make(chan time.Time, 1)
	r.onAck = func(batonnats.Trigger, time.Time, time.Time) {
		if acked.Add(1) == backlogRows {
			done <- time.Now()
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	relayStart := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(runCtx) })
	var relayTime time.Duration
	select {
	case at := <-done:
		relayTime = at.Sub(relayStart)
	case <-time.After(10 * time.Minute):
		b.Fatalf("the relay acknowledged %d of %d rows in 10 minutes", acked.Load(), backlogRows)
	}
	cancel()
	wg.Wait()
	rawAfter := recvlogical(rawSlots[1])
	b.StopTimer()

	rawTime := min(rawBefore, rawAfter)
	rawRate := backlogRows / rawTime.Seconds()
	relayRate := backlogRows / relayTime.Seconds()
	b.ReportMetric(relayRate, "relay_rows/s")
	b.ReportMetric(rawRate, "pg_recvlogical_rows/s")
	b.ReportMetric(100*relayRate/rawRate, "%_of_raw")
	b.Logf("backlog %d rows: relay %.0f rows/s (%s), pg_recvlogical %.0f rows/s (best of %s before and %s after the relay): %.0f%%",
		backlogRows, relayRate, relayTime.Round(time.Millisecond), rawRate,
		rawBefore.Round(time.Millisecond), rawAfter.Round(time.Millisecond), 100*relayRate/rawRate)
}

// BenchmarkRelayLatency measures commit-to-PubAck latency at a steady
// 1,000 inserts per second, one row per transaction.
func BenchmarkRelayLatency(b *testing.B) {
	for range b.N {
		latencyOnce(b, 1000, 10*time.Second)
	}
}

func latencyOnce(b *testing.B, perSecond int, duration time.Duration) {
	ctx := context.Background()
	db := testenv.Database(b)
	n := testenv.StartNATS(b)
	_, js := n.Connect(b)
	bb := &bundle{pool: db.Pool, dbURL: db.URL, nats: n, js: js}
	r, err := New(Config{Slot: "bench_lat_" + db.Name, SweepInterval: time.Hour, SweepAge: time.Hour}, db.Pool, bb.relayConn(b), testLogger(b))
	require.NoError(b, err)
	var mu sync.Mutex
	var latencies []time.Duration
	r.onAck = func(_ batonnats.Trigger, commit, ack time.Time) {
		mu.Lock()
		latencies = append(latencies, ack.Sub(commit))
		mu.Unlock()
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(runCtx) })
	require.Eventually(b, r.active.Load, 30*time.Second, 10*time.Millisecond)

	_, user, err := schemaUser(ctx, db)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) SELECT 'lat.' || g, 'lat.' || g, $1 FROM generate_series(0, 99) g`, user)
	require.NoError(b, err)
	// The test cluster runs with synchronous_commit = off, whose commits
	// reach the WAL sender only when the WAL writer flushes them (every
	// wal_writer_delay, 200 ms). Producers commit as production does.
	pcfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(b, err)
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	producerPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(b, err)
	defer producerPool.Close()

	// Several producers share the rate, so one slow commit does not hold
	// the schedule back.
	const producers = 8
	total := perSecond * int(duration/time.Second)
	interval := time.Second * producers / time.Duration(perSecond)
	b.ResetTimer()
	var pwg sync.WaitGroup
	for p := range producers {
		pwg.Go(func() {
			next := time.Now().Add(time.Duration(p) * time.Second / time.Duration(perSecond))
			for i := p; i < total; i += producers {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				_, err := producerPool.Exec(ctx, `
					WITH m AS (INSERT INTO messages (id, conversation_id, role, content)
					           VALUES ('lat-' || $1::int, 'lat.' || ($1::int % 100), 'user', 'hi') RETURNING id, conversation_id)
					INSERT INTO agent_outbox (conversation_id, message_id) SELECT conversation_id, id FROM m`, i)
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	pwg.Wait()
	require.Eventually(b, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(latencies) >= total
	}, time.Minute, 10*time.Millisecond)
	b.StopTimer()
	cancel()
	wg.Wait()

	slices.Sort(latencies)
	p50 := latencies[len(latencies)/2]
	p99 := latencies[len(latencies)*99/100]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	b.Logf("%d inserts at %d/s: commit-to-PubAck p50 %s, p99 %s, max %s", total, perSecond, p50, p99, latencies[len(latencies)-1])
}

func schemaUser(ctx context.Context, db *testenv.DB) (string, int64, error) {
	var id int64
	err := db.Pool.QueryRow(ctx, `INSERT INTO users (name) VALUES ($1) RETURNING id`, fmt.Sprintf("bench-%s", db.Name)).Scan(&id)
	return "", id, err
}
