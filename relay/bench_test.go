package relay

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// The benchmarks run only with -bench, never in the normal test path
// (`make bench` runs them all and prints one table):
//
//	go test -run '^$' -bench 'BenchmarkRelay' -benchtime 1x ./relay/

// drainPayload is the JSON every outbox row of BenchmarkRelayDrain
// carries in a column of the benchmark's own, about 1 KB: a wider row
// than Baton's, which the publication carries and the relay's decoder
// must pass over.
const drainPayload = `jsonb_build_object('row', g, 'text', repeat(md5(g::text), 31))`

// BenchmarkRelayDrain measures a `baton relay` process draining a backlog
// of 1,000,000 outbox rows with 1 KB of JSON each, published to a stream
// of one replica on one NATS server and of three replicas on a
// three-node cluster, against pg_recvlogical's raw decode of the same
// slot contents (same plugin options, slots created at the same
// position; pg_recvlogical reads the backlog before the relays and again
// after them, and the faster of its two runs is the reference, so neither
// the order of the runs nor a disturbance during one of them favours the
// relay). It reports the relay's peak resident memory (its own process)
// and compares the drain time with that of a 100,000-row backlog.
func BenchmarkRelayDrain(b *testing.B) {
	for range b.N {
		drainOnce(b)
	}
}

type drainResult struct {
	relay, raw map[int]time.Duration // by replicas
	peakRSS    map[int]int64
}

func drainOnce(b *testing.B) {
	bin := bench.Binary(b)
	pg := bench.StartPostgres(b, map[string]string{"max_wal_size": "8GB"})
	b.ResetTimer()
	results := map[int]drainResult{}
	for _, rows := range []int{100_000, 1_000_000} {
		results[rows] = drainBacklog(b, pg, bin, rows)
	}
	b.StopTimer()
	for _, replicas := range []int{1, 3} {
		big, small := results[1_000_000], results[100_000]
		where := "one NATS server, stream replicas 1"
		if replicas == 3 {
			where = "three-node NATS cluster, stream replicas 3"
		}
		rate := 1_000_000 / big.relay[replicas].Seconds()
		raw := 1_000_000 / big.raw[replicas].Seconds()
		id := map[int]string{1: "4a", 3: "4b"}[replicas]
		bench.Record(b, bench.Figure{ID: id, Name: "relay drain of 1,000,000 rows of 1 KB JSON, " + where,
			Value: bench.Thousands(rate) + " rows/s", Reference: bench.Thousands(raw) + " rows/s, pg_recvlogical on the same slot contents",
			Ratio: rate / raw, Aim: "0.9 or more", Met: bench.Verdict(rate/raw >= 0.9)})
		peak := big.peakRSS[replicas]
		bench.Record(b, bench.Figure{ID: map[int]string{1: "4c", 3: "4d"}[replicas], Name: "relay peak resident memory (VmHWM of its process) over that drain, " + where,
			Value: bench.MiB(peak), Aim: "64 MiB or less", Met: bench.Verdict(peak <= 64<<20)})
		ratio := float64(big.relay[replicas]) / float64(10*small.relay[replicas])
		bench.Record(b, bench.Figure{ID: map[int]string{1: "4e", 3: "4f"}[replicas], Name: "relay drain time of 1,000,000 rows against ten times that of 100,000, " + where,
			Value: big.relay[replicas].Round(time.Millisecond).String(), Reference: "10 x " + small.relay[replicas].Round(time.Millisecond).String(),
			Ratio: ratio, Aim: "linear within 20% (0.8 to 1.2)", Met: bench.Verdict(ratio >= 0.8 && ratio <= 1.2)})
	}
}

// drainBacklog commits a backlog of rows outbox rows and drains it with
// pg_recvlogical, a relay on one NATS server, a relay on a three-node
// cluster, and pg_recvlogical again, each from a slot of its own created
// before the backlog.
func drainBacklog(b *testing.B, pg *bench.Postgres, bin string, rows int) drainResult {
	ctx := context.Background()
	db := pg.Database(b)
	db.Migrate(b, bin)
	_, err := db.Pool.Exec(ctx, `ALTER TABLE agent_outbox ADD COLUMN bench_payload jsonb`)
	require.NoError(b, err)
	slots := map[string]string{}
	for _, s := range []string{"raw_before", "relay_r1", "relay_r3", "raw_after"} {
		slots[s] = fmt.Sprintf("bench_%s_%s", s, db.Name)
		_, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slots[s])
		require.NoError(b, err)
	}
	var user int64
	require.NoError(b, db.Pool.QueryRow(ctx, `INSERT INTO users (name) VALUES ('bench') RETURNING id`).Scan(&user))
	_, err = db.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) SELECT 'bench.' || g, 'bench.' || g, $1 FROM generate_series(0, 99) g`, user)
	require.NoError(b, err)
	const perTx = 1000
	filled := time.Now()
	for start := 0; start < rows; start += perTx {
		_, err := db.Pool.Exec(ctx, `
			WITH m AS (
				INSERT INTO messages (id, conversation_id, role, content)
				SELECT 'm' || g, 'bench.' || (g % 100), 'user', 'hello'
				FROM generate_series($1::int, $2::int) g
				RETURNING id, conversation_id, substr(id, 2)::int AS g)
			INSERT INTO agent_outbox (conversation_id, message_id, bench_payload) SELECT conversation_id, id, `+drainPayload+` FROM m`, start, start+perTx-1)
		require.NoError(b, err)
	}
	end := currentLSN(b, db.Pool)
	// Settle the server before anything is timed: the tables vacuumed and
	// analyzed, so autovacuum does not wake up in the middle of one run
	// and not the other, and a checkpoint.
	_, err = db.Pool.Exec(ctx, `VACUUM (ANALYZE) messages, agent_outbox`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(b, err)
	var walBytes int64
	require.NoError(b, db.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::text::pg_lsn, confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $2`,
		end.String(), slots["raw_before"]).Scan(&walBytes))
	b.Logf("backlog of %d rows committed in %s: %s of WAL", rows, time.Since(filled).Round(time.Millisecond), bench.MiB(walBytes))

	recvlogical := func(slot string) time.Duration {
		raw := exec.Command(filepath.Join(pg.BinDir(), "pg_recvlogical"), "-d", db.URL, "--slot", slot, "--start",
			"-o", "proto_version=1", "-o", "publication_names=baton_outbox", "-o", "messages=true",
			"--endpos", end.String(), "--no-loop", "-f", "/dev/null")
		start := time.Now()
		out, err := raw.CombinedOutput()
		elapsed := time.Since(start)
		require.NoError(b, err, "pg_recvlogical: %s", out)
		return elapsed
	}
	res := drainResult{relay: map[int]time.Duration{}, raw: map[int]time.Duration{}, peakRSS: map[int]int64{}}
	before := recvlogical(slots["raw_before"])
	for _, replicas := range []int{1, 3} {
		var nodes []*testenv.NATS
		if replicas == 1 {
			nodes = []*testenv.NATS{testenv.StartNATS(b)}
		} else {
			nodes = testenv.NATSCluster(b, 3)
		}
		var urls []string
		for _, n := range nodes {
			urls = append(urls, n.URL)
		}
		_, js := nodes[0].Connect(b)
		waitJetStream(b, js)
		selfBefore, _ := bench.CPU(0)
		relay := bench.Start(b, "relay", bin, "relay", "--database-url", db.URL, "--nats-url", strings.Join(urls, ","),
			"--slot", slots[fmt.Sprintf("relay_r%d", replicas)], "--replicas", strconv.Itoa(replicas),
			"--sweep-interval", "1h", "--sweep-age", "1h")
		stopProfile := relay.Profile(b, fmt.Sprintf("relay-%d-rows-r%d", rows, replicas))
		waitStreamMsgs(b, js, rows, 10*time.Minute)
		stopProfile()
		res.relay[replicas] = time.Since(relay.Started)
		mem, err := relay.Memory()
		require.NoError(b, err)
		res.peakRSS[replicas] = mem.PeakRSS
		// Where the processor time went: the relay, the WAL sender that
		// decodes for it, and this process (the NATS servers).
		relayCPU, _ := relay.CPU()
		selfCPU, _ := bench.CPU(0)
		var sender int
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, slots[fmt.Sprintf("relay_r%d", replicas)]).Scan(&sender)
		senderCPU, _ := bench.CPU(sender)
		relay.Stop()
		b.Logf("%d rows, stream replicas %d: relay drained in %s (%.0f rows/s), peak RSS %s; processor time: relay %s, WAL sender %s, NATS (this process) %s",
			rows, replicas, res.relay[replicas].Round(time.Millisecond), float64(rows)/res.relay[replicas].Seconds(), bench.MiB(mem.PeakRSS),
			relayCPU.Round(time.Millisecond), senderCPU.Round(time.Millisecond), (selfCPU - selfBefore).Round(time.Millisecond))
		// The stream's store is large; free the disk before the next run.
		require.NoError(b, js.DeleteStream(ctx, batonnats.DefaultStream))
		for _, n := range nodes {
			n.Stop()
		}
	}
	after := recvlogical(slots["raw_after"])
	b.Logf("%d rows: pg_recvlogical %s before the relays and %s after", rows, before.Round(time.Millisecond), after.Round(time.Millisecond))
	for _, replicas := range []int{1, 3} {
		res.raw[replicas] = min(before, after)
	}
	return res
}

// waitJetStream waits until JetStream answers: a cluster that just
// started elects its leader first.
func waitJetStream(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("JetStream did not answer within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitStreamMsgs waits until the outbox stream holds n messages.
func waitStreamMsgs(b *testing.B, js jetstream.JetStream, n int, within time.Duration) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		if st, err := js.Stream(ctx, batonnats.DefaultStream); err == nil && st.CachedInfo().State.Msgs >= uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the outbox stream did not reach %d messages within %s", n, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	r, err := New(Config{Slot: "bench_lat_" + db.Name, SweepInterval: time.Hour, SweepAge: time.Hour, Logger: testLogger(b)}, db.Pool, bb.relayConn(b))
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
	bench.Record(b, bench.Figure{ID: "5a", Name: fmt.Sprintf("relay commit-to-PubAck latency at %s inserts/s, one row each, p50 / p99 (relay in process, tests' cluster)", bench.Thousands(float64(perSecond))),
		Value: bench.Ms(p50) + " / " + bench.Ms(p99)})
}

func schemaUser(ctx context.Context, db *testenv.DB) (string, int64, error) {
	var id int64
	err := db.Pool.QueryRow(ctx, `INSERT INTO users (name) VALUES ($1) RETURNING id`, fmt.Sprintf("bench-%s", db.Name)).Scan(&id)
	return "", id, err
}
