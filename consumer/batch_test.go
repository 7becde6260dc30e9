package consumer

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestBatcherRunsALoneCallAtOnceAndGroupsThoseThatWait: a call that finds
// no batch running runs alone; the calls that arrive while a batch runs
// all go into the next batch, each getting its own result.
func TestBatcherRunsALoneCallAtOnceAndGroupsThoseThatWait(t *testing.T) {
	started := make(chan []int, 10)
	release := make(chan struct{})
	b := startBatcher(64, func(reqs []int) []int {
		started <- reqs
		<-release
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r * 10
		}
		return out
	})
	defer b.close()

	var wg sync.WaitGroup
	results := make([]int, 6)
	wg.Go(func() { results[0] = b.do(0) })
	require.Equal(t, []int{0}, <-started, "a lone call runs at once, alone")
	for i := 1; i < 6; i++ {
		wg.Go(func() { results[i] = b.do(i) })
	}
	// The five wait for the first batch: the runner is busy with it. Once
	// each has queued its call, release the first batch.
	for len(b.calls) < 5 {
		runtime.Gosched()
	}
	close(release)
	second := <-started
	require.ElementsMatch(t, []int{1, 2, 3, 4, 5}, second, "the calls that waited share the next batch")
	wg.Wait()
	require.Equal(t, []int{0, 10, 20, 30, 40, 50}, results, "each call gets its own result")
}

// TestTurnsThatWaitForAClaimShareTheNextStatement: while one claim
// statement waits (here for outbox rows a test transaction holds, as a
// relay's sweep does for a moment),
// the turns that become ready queue behind it, and once it is through they
// are all claimed by one statement: 20 conversations take two claim
// statements, not 20, and each is answered once.
func TestTurnsThatWaitForAClaimShareTheNextStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 20
	keys := make([]string, n)
	for i := range n {
		keys[i] = b.Conversation(fmt.Sprintf("c%d", i))
		b.Send(fmt.Sprintf("c%d", i), fmt.Sprintf("m%d", i), "hello")
	}
	tx, err := b.DB.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT id FROM agent_outbox WHERE conversation_id = ANY($1) FOR UPDATE`, keys)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	cfg := b.testConfig()
	cfg.Registerer = reg
	w := b.startWorker(cfg)
	claims := func() (statements uint64, turns float64) {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			for _, m := range f.GetMetric() {
				if f.GetName() == "baton_worker_statement_turns" && m.GetLabel()[0].GetValue() == "claim" {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
		return 0, 0
	}
	queued := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.claims == nil {
			return 0
		}
		return len(w.claims.calls)
	}
	// Every conversation is in the first statement, which waits for the
	// locks, or queued behind it.
	b.Eventually(30*time.Second, func() bool {
		statements, turns := claims()
		return statements == 1 && int(turns)+queued() == n
	}, "the first claim statement waits and the other turns queue behind it")
	require.NoError(t, tx.Rollback(ctx))

	b.settled(30 * time.Second)
	require.Equal(t, n, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`), "each conversation answered once")
	statements, turns := claims()
	require.EqualValues(t, n, turns, "each conversation claimed once")
	require.LessOrEqual(t, statements, uint64(2), "the turns that waited were claimed together")
}
