package cli

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// The relay collects garbage less often than Go's default, within a soft
// memory limit, unless the operator set GOGC or GOMEMLIMIT: then theirs
// stand.
func TestTheRelaysGarbageCollectionDefaultsGiveWayToGOGCAndGOMEMLIMIT(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	relayGC()
	require.Equal(t, relayGCPercent, debug.SetGCPercent(100), "without GOGC the relay's percent applies")
	require.Equal(t, int64(relayMemoryGoal), debug.SetMemoryLimit(math.MaxInt64), "without GOMEMLIMIT the relay's limit applies")

	// The runtime read GOGC=150 and GOMEMLIMIT=1GiB at start; the relay
	// must leave what it read alone.
	debug.SetGCPercent(150)
	debug.SetMemoryLimit(1 << 30)
	t.Setenv("GOGC", "150")
	t.Setenv("GOMEMLIMIT", "1GiB")
	relayGC()
	require.Equal(t, 150, debug.SetGCPercent(100), "GOGC stands")
	require.Equal(t, int64(1<<30), debug.SetMemoryLimit(math.MaxInt64), "GOMEMLIMIT stands")
}
