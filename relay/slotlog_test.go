package relay

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// logLines collects the log lines the relay's goroutines write.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

// with returns the lines that hold every one of parts.
func (l *logLines) with(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

func TestAFirstStartLogsSlotCreatedAtInfoAndOnlyAVanishedSlotWarns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A heartbeat records the slot as soon as it exists: one every
	// millisecond falls between the relay creating the slot and deciding
	// whether it was recorded before, where a first start once looked like
	// a vanished slot.
	b.cfg.HeartbeatInterval = time.Millisecond
	ctx := context.Background()
	runOnce := func() *logLines {
		logs := &logLines{}
		cfg := b.cfg
		log := zerolog.New(logs)
		cfg.Logger = &log
		r, err := New(cfg, b.pool, b.relayConn(t))
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		waitActive(t, r)
		// A running relay records its slot at each heartbeat.
		require.Eventually(t, func() bool { return r.slotRecorded(ctx) }, 30*time.Second, 10*time.Millisecond, "the relay records its slot")
		cancel()
		require.NoError(t, <-done)
		return logs
	}

	first := runOnce()
	require.Len(t, first.with(`"level":"info"`, `"message":"slot created"`), 1, "a first start creates the slot, at info")
	require.Empty(t, first.with(`"level":"warn"`), "nothing is wrong on a first start")

	// The slot vanishes while no relay runs (dropped, or a failover to a
	// standby): the next start recreates it and warns.
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, b.cfg.Slot)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "drop the slot once its relay let it go")
	second := runOnce()
	require.Len(t, second.with(`"level":"warn"`, `"cause":"missing"`, "slot (re)created"), 1, "a slot that vanished warns")
	require.Empty(t, second.with(`"message":"slot created"`))
}

// TestASlotWhoseProgressCannotBeRecordedIsWarnedAboutOnce: without its
// table (or the right to write it) the relay runs on, warns once that
// status cannot see a stalled slot, and says when it records again.
func TestASlotWhoseProgressCannotBeRecordedIsWarnedAboutOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `ALTER TABLE relay_slot_progress RENAME TO relay_slot_progress_away`)
	require.NoError(t, err)
	logs := &logLines{}
	cfg := b.cfg
	log := zerolog.New(logs)
	cfg.Logger = &log
	r, err := New(cfg, b.pool, b.relayConn(t))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	waitActive(t, r)
	unrecorded := func() []string {
		return logs.with(`"level":"warn"`, "cannot be recorded in relay_slot_progress", "baton migrate")
	}
	require.Eventually(t, func() bool { return len(unrecorded()) == 1 }, 30*time.Second, 10*time.Millisecond, "the relay warns that it cannot record the slot")

	_, err = b.pool.Exec(ctx, `ALTER TABLE relay_slot_progress_away RENAME TO relay_slot_progress`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.slotRecorded(ctx) }, 30*time.Second, 10*time.Millisecond, "the relay records its slot again")
	require.Eventually(t, func() bool { return len(logs.with(`"level":"info"`, "recorded again")) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Len(t, unrecorded(), 1, "warned once, not at every heartbeat")
}
