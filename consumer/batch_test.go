package consumer

import (
	"runtime"
	"sync"
	"testing"

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
