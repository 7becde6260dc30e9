package consumer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pgbenchTurn runs what one turn costs PostgreSQL with the same statements
// as the producer, ClaimTx and FinalizeTx, for one random conversation of
// 1,000: insert a message with its outbox row, claim, finalize.
const pgbenchTurn = `
\set c random(1, 1000)
SELECT quote_literal(gen_random_uuid()::text) AS run, quote_literal('bench-' || gen_random_uuid()::text) AS msg \gset
BEGIN;
INSERT INTO messages (id, conversation_id, role, content) VALUES (:msg, 'bench-' || :c, 'user', 'hello') ON CONFLICT (id) DO NOTHING RETURNING seq, created_at;
INSERT INTO agent_outbox (conversation_id, message_id) VALUES ('bench-' || :c, :msg) RETURNING id;
UPDATE conversations SET updated_at = now(), last_message_at = now() WHERE id = 'bench-' || :c;
COMMIT;
BEGIN;
SELECT run_id, lease_expires_at, COALESCE(lease_expires_at <= now(), false) FROM conversations WHERE id = 'bench-' || :c FOR UPDATE;
WITH claimed AS (
	UPDATE agent_outbox SET status = 'processing', attempts = attempts + 1, run_id = :run
	WHERE conversation_id = 'bench-' || :c AND status = 'pending'
	RETURNING id, attempts, created_at)
SELECT quote_literal(COALESCE(array_agg(id ORDER BY id), '{}')::text) AS ids, quote_literal('turn_' || md5(COALESCE(array_agg(id ORDER BY id), '{}')::text)) AS turn FROM claimed \gset
WITH lease AS (
	UPDATE conversations SET run_id = :run, lease_expires_at = clock_timestamp() + make_interval(secs => 30)
	WHERE id = 'bench-' || :c RETURNING lease_expires_at)
INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, started_at, lease_expires_at)
SELECT :run, 'bench-' || :c, :turn, :ids::bigint[], 'pgbench', clock_timestamp(), lease_expires_at FROM lease
RETURNING lease_expires_at;
COMMIT;
SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq FROM agent_outbox o JOIN messages m ON m.id = o.message_id WHERE o.id = ANY(:ids::bigint[]) AND o.conversation_id = 'bench-' || :c ORDER BY m.seq;
SELECT id, conversation_id, role, content, created_at, seq FROM (SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id WHERE m.conversation_id = 'bench-' || :c AND (o.id IS NULL OR o.status IN ('done', 'error')) ORDER BY m.seq DESC LIMIT 50) h ORDER BY seq;
BEGIN;
INSERT INTO messages (id, conversation_id, role, content, run_id, turn_id) VALUES ('reply_' || :run, 'bench-' || :c, 'assistant', 'echo: hello', :run, :turn);
UPDATE conversations SET run_id = NULL, lease_expires_at = NULL, updated_at = now(), last_message_at = now(), unread_count = unread_count + 1 WHERE id = 'bench-' || :c AND run_id = :run;
UPDATE agent_outbox SET status = 'done', processed_at = now() WHERE id = ANY(:ids::bigint[]) AND run_id = :run AND status = 'processing';
UPDATE operations SET message_id = 'reply_' || :run WHERE run_id = :run AND message_id IS NULL;
UPDATE agent_runs SET status = 'finalized', reply_message_id = 'reply_' || :run, finished_at = clock_timestamp() WHERE id = :run;
COMMIT;
`

// BenchmarkTurns measures turns per second through the whole path (producer
// transaction, relay, JetStream, worker with the echo agent and no
// debounce, finalize) over 1,000 conversations, and the latency from outbox
// insert to finalize; then pgbench runs the same producer, claim and
// finalize statements on the same database, as the ceiling to compare
// with. Run it with:
//
//	go test -run '^$' -bench BenchmarkTurns -benchtime 5000x ./consumer/
func BenchmarkTurns(b *testing.B) {
	pgbench := "/usr/lib/postgresql/15/bin/pgbench"
	if p, err := exec.LookPath("pgbench"); err == nil {
		pgbench = p
	}
	if _, err := os.Stat(pgbench); err != nil {
		b.Skip("pgbench not found")
	}
	bb := setup(b)
	ctx := context.Background()
	const conversations = 1000
	_, err := bb.DB.Pool.Exec(ctx, `INSERT INTO conversations (id, public_id, owner_id) SELECT 'bench-' || i, 'bench-' || i, $1 FROM generate_series(1, $2) i`, bb.Owner, conversations)
	require.NoError(b, err)
	cfg := bb.testConfig()
	cfg.Lease = 30 * time.Second
	cfg.Concurrency = 64
	bb.startWorker(cfg)

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	const producers = 8
	for g := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < b.N; i += producers {
				bb.Send(fmt.Sprintf("bench-%d", i%conversations+1), fmt.Sprintf("m%d", i), "hello")
			}
		}()
	}
	wg.Wait()
	bb.Eventually(10*time.Minute, func() bool {
		return bb.Count(`SELECT count(*) FROM agent_outbox WHERE status <> 'done'`) == 0
	}, "every message answered")
	elapsed := time.Since(start)
	b.StopTimer()

	turns := bb.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized'`)
	var p50, p99 float64
	require.NoError(b, bb.DB.Pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l), percentile_cont(0.99) WITHIN GROUP (ORDER BY l)
		FROM (SELECT extract(epoch FROM r.finished_at - o.created_at) * 1000 AS l
		      FROM agent_runs r JOIN agent_outbox o ON o.id = ANY(r.outbox_ids) WHERE r.status = 'finalized') x`).Scan(&p50, &p99))
	turnsPerSec := float64(turns) / elapsed.Seconds()

	script := filepath.Join(b.TempDir(), "turn.sql")
	require.NoError(b, os.WriteFile(script, []byte(pgbenchTurn), 0o644))
	out, err := exec.Command(pgbench, "-n", "-f", script, "-c", "8", "-j", "2", "-T", "10", bb.DB.URL).CombinedOutput()
	require.NoError(b, err, "pgbench: %s", out)
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	require.NotNil(b, m, "pgbench output has no tps: %s", out)
	pgbenchTPS, _ := strconv.ParseFloat(string(m[1]), 64)

	b.ReportMetric(turnsPerSec, "turns/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(p50, "p50_ms")
	b.ReportMetric(p99, "p99_ms")
	b.ReportMetric(pgbenchTPS, "pgbench_turns/s")
	b.ReportMetric(turnsPerSec/pgbenchTPS, "ratio")
	b.Logf("%d messages, %d turns in %s: %.0f turns/s; pgbench %.0f turns/s; ratio %.2f; insert->finalize p50 %.1f ms p99 %.1f ms",
		b.N, turns, elapsed.Round(time.Millisecond), turnsPerSec, pgbenchTPS, turnsPerSec/pgbenchTPS, p50, p99)
}
