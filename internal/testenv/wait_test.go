package testenv_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var checks atomic.Int32
	testenv.Eventually(t, 10*time.Second, func() bool { return checks.Add(1) == 3 }, "the third check")
	require.EqualValues(t, 3, checks.Load(), "no check after the one that held")
}

func TestEventuallyFailsAfterTheTimeoutSayingWhatItWaitedFor(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	began := time.Now()
	testenv.Eventually(r, 50*time.Millisecond, func() bool { return false }, "row %d to be %s", 7, "done")
	require.GreaterOrEqual(t, time.Since(began), 50*time.Millisecond)
	require.Equal(t, []string{"after 50ms, still waiting: row 7 to be done"}, r.failures)
}
