package relay

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestStandbyRelayMeasuresTheStallOfAHungRelayAndSeesItEnd: a relay that
// hangs (SIGSTOP) keeps its slot active, since its connection stays open,
// and confirms nothing more while WAL grows. The relay standing by records
// the slot at each heartbeat: its baton_relay_slot_stalled_seconds grows,
// and what it records (what `baton status` reads) says the same; both go
// back to zero once the hung relay continues and confirms again.
func TestStandbyRelayMeasuresTheStallOfAHungRelayAndSeesItEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.conversation(t, "hung")
	first := b.startProcess(t, "--status-interval", "100ms")
	first.waitLogged(t, "connected; streaming", time.Minute)
	standby, _ := b.start(t, b.cfg)
	stalled := func() float64 {
		var m dto.Metric
		require.NoError(t, standby.metrics.slotStalled.Write(&m))
		return m.GetGauge().GetValue()
	}

	var ids []int64
	for i := range 20 {
		ids = append(ids, b.insert(t, "hung", fmt.Sprintf("before-%d", i)))
	}
	waitStreamCount(t, b.js, len(ids), time.Minute)
	waitConfirmedPast(t, b.pool, b.cfg.Slot, currentLSN(t, b.pool), time.Minute)
	require.False(t, standby.active.Load(), "the in-process relay stands by")

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGSTOP))
	// Before the process's own cleanup, which stops it with SIGTERM.
	t.Cleanup(func() { _ = first.cmd.Process.Signal(syscall.SIGCONT) })
	hung := time.Now()
	for i := range 20 {
		ids = append(ids, b.insert(t, "hung", fmt.Sprintf("while-hung-%d", i)))
	}
	require.Eventually(t, func() bool { return stalled() >= 1 }, 30*time.Second, 10*time.Millisecond,
		"the standby relay's baton_relay_slot_stalled_seconds reaches 1s while the streaming relay hangs")
	t.Logf("stalled %.1fs by the standby's gauge, %s after the SIGSTOP", stalled(), time.Since(hung).Round(time.Millisecond))
	p, err := schema.ReadSlotProgress(ctx, b.pool, b.cfg.Slot)
	require.NoError(t, err)
	require.True(t, p.Recorded)
	require.GreaterOrEqual(t, p.Stalled, time.Second, "the records show the stall")
	require.Positive(t, p.LagBytes, "WAL waits behind the slot")
	var active bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, b.cfg.Slot).Scan(&active))
	require.True(t, active, "a hung relay keeps its slot active: only the stall shows it")

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return stalled() == 0 }, 30*time.Second, 10*time.Millisecond,
		"the gauge is 0 again once the relay continues and confirms")
	waitStreamCount(t, b.js, len(ids), time.Minute)
	requireExactlyOnce(t, streamEvents(t, b.js), ids)
}
