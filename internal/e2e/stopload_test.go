package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// stopLoad is turns stopped mid-reply through the API of real Baton
// processes: two workers, a model that writes thousands of words.
type stopLoad struct {
	*processStack
	model   *agenttest.Server
	workers []*proctest.Process
	token   string
	client  *http.Client
}

func startStopLoad(t testing.TB) *stopLoad {
	t.Helper()
	s := &stopLoad{processStack: startProcessStack(t), client: &http.Client{Timeout: 30 * time.Second}}
	s.model = agenttest.NewResponder(t, func(int, agenttest.Request) agenttest.Response { return agenttest.Steady(5000, 20*time.Millisecond) })
	// A short lease, so that the runs of a killed worker are recovered
	// within seconds.
	for range 2 {
		s.workers = append(s.workers, s.startWorker(s.model.BaseURL(), "--lease", "3s"))
	}
	var err error
	s.token, _, err = schema.CreateToken(context.Background(), s.db.Pool, "load")
	require.NoError(t, err)
	return s
}

func (s *stopLoad) call(t testing.TB, method, path string, body any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+s.apiAddr+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.client.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Less(t, res.StatusCode, 300, "%s %s: %s", method, path, raw)
}

// run stops n turns of conversations named prefix-i mid-reply, each once
// through the API, and, with kill, kills the first worker right after the
// last stop committed. It returns how long each stop took to commit its
// stopped reply, from the request.
func (s *stopLoad) run(t testing.TB, prefix string, n int, kill bool) []time.Duration {
	t.Helper()
	ctx := context.Background()
	calls := s.model.Count()
	convs := make([]string, n)
	for i := range convs {
		convs[i] = fmt.Sprintf("%s-%d", prefix, i)
		s.call(t, "POST", "/v1/conversations", map[string]any{"id": convs[i]})
		s.call(t, "POST", "/v1/conversations/"+convs[i]+"/messages", map[string]any{"id": convs[i] + "-m", "content": "write at length"})
	}
	const inTest = `FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id WHERE c.public_id LIKE $1 || '-%'`
	testenv.Eventually(t, time.Minute, func() bool {
		return testenv.Count(t, s.db.Pool, `SELECT count(*) `+inTest+` AND o.status = 'processing'`, prefix) == n
	}, "every turn to run")
	chunks := s.model.Chunks()
	s.model.WaitChunks(t, chunks+int64(5*n), time.Minute) // mid-reply, all of them

	stoppedAt := make([]time.Time, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range convs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			stoppedAt[i] = time.Now()
			req, _ := http.NewRequest("POST", "http://"+s.apiAddr+"/v1/conversations/"+convs[i]+"/stop", nil)
			req.Header.Set("Authorization", "Bearer "+s.token)
			if res, err := s.client.Do(req); err == nil {
				res.Body.Close()
			}
		})
	}
	wg.Wait()
	if kill {
		s.workers[0].Kill()
	}
	testenv.Eventually(t, 2*time.Minute, func() bool {
		return testenv.Count(t, s.db.Pool, `SELECT count(*) `+inTest+` AND o.status <> 'done'`, prefix) == 0
	}, "every stopped turn to settle")

	const runs = `FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.public_id LIKE $1 || '-%'`
	require.Equal(t, n, testenv.Count(t, s.db.Pool, `SELECT count(*) `+runs, prefix), "one run each: none retried")
	require.Equal(t, n, testenv.Count(t, s.db.Pool, `SELECT count(*) `+runs+` AND r.status = 'finalized'
		AND EXISTS (SELECT 1 FROM messages m WHERE m.id = r.reply_message_id AND m.stopped)`, prefix), "each run ended with its stopped reply")
	const msgs = `FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id LIKE $1 || '-%'`
	require.Equal(t, n, testenv.Count(t, s.db.Pool, `SELECT count(*) `+msgs+` AND m.role = 'assistant' AND m.stopped`, prefix), "each turn has its stopped reply")
	require.Equal(t, n, testenv.Count(t, s.db.Pool, `SELECT count(*) `+msgs+` AND m.role = 'assistant'`, prefix), "and no other reply")
	require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) `+msgs+` AND m.role = 'error'`, prefix), "a stop is no failure")
	if !kill {
		require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) `+msgs+` AND m.role = 'assistant' AND m.content = ''`, prefix), "a stopped reply keeps what it wrote")
	}
	require.Equal(t, calls+n, s.model.Count(), "one model call each: nothing answered again")

	took := make([]time.Duration, n)
	for i, c := range convs {
		var finished time.Time
		require.NoError(t, s.db.Pool.QueryRow(ctx, `
			SELECT r.finished_at FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.public_id = $1`, c).Scan(&finished))
		took[i] = finished.Sub(stoppedAt[i])
	}
	return took
}

// TestStoppedTurnsUnderLoadEndOnceAndAreNeverAnsweredLater: turns stopped
// mid-reply end stopped, each once, none retried or answered later; and
// the same when a worker is killed right after the stops (its runs that
// missed the notice are settled stopped by recovery). `make test` runs 20
// of each; BenchmarkStopUnderLoad runs 100.
func TestStoppedTurnsUnderLoadEndOnceAndAreNeverAnsweredLater(t *testing.T) {
	t.Parallel()
	s := startStopLoad(t)
	s.run(t, "calm", 20, false)
	s.run(t, "killed", 20, true)
}

// BenchmarkStopUnderLoad stops 100 turns mid-reply, then 100 more and
// kills a worker right after, and reports how long a stop takes from its
// request to its stopped reply committed:
//
//	go test -run '^$' -bench BenchmarkStopUnderLoad -benchtime 1x ./internal/e2e/
func BenchmarkStopUnderLoad(b *testing.B) {
	for range b.N {
		s := startStopLoad(b)
		took := s.run(b, "calm", 100, false)
		s.run(b, "killed", 100, true)
		p50, p99 := bench.Percentile(took, 50), bench.Percentile(took, 99)
		b.ReportMetric(float64(p50.Microseconds())/1000, "stop_p50_ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "stop_p99_ms")
		bench.Record(b, bench.Figure{ID: "S1a", Name: fmt.Sprintf("stop of a turn mid-reply, request to stopped reply committed, p50 (%d stops, 100 turns streaming)", len(took)), Value: bench.Ms(p50)})
		bench.Record(b, bench.Figure{ID: "S1b", Name: "same, p99", Value: bench.Ms(p99)})
	}
}
