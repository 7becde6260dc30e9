package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestStatusReportsInactiveSlotWithLagAndExitsNonZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	stream := "ST_" + strings.ToUpper(db.Name)
	prefix := "st." + db.Name
	s, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{Name: stream, SubjectPrefix: prefix}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	_, err = s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)

	// A slot that no relay reads, with WAL written after it.
	slot := "slot_" + db.Name
	_, err = db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	_, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	_, _, err = schema.CreateConversation(ctx, db.Pool, u.ID, "c1", "")
	require.NoError(t, err)
	for i := range 50 {
		_, err = schema.InsertMessageTx(ctx, db.Pool, schema.UserMessage{OwnerID: u.ID, ConversationID: "c1", MessageID: fmt.Sprint("m", i), Content: strings.Repeat("x", 1000)})
		require.NoError(t, err)
	}

	args := []string{"status", "--database-url", db.URL, "--nats-url", ns.URL, "--stream", stream, "--subject-prefix", prefix, "--slot", slot}
	out, stderr, code := run(t, append(args, "--json")...)
	require.Equal(t, 3, code, "a slot nobody reads needs attention: %s", stderr)
	var rep struct {
		Slot struct {
			Exists   bool  `json:"exists"`
			Active   bool  `json:"active"`
			LagBytes int64 `json:"lag_bytes"`
		} `json:"slot"`
		Stream struct {
			Name string `json:"name"`
		} `json:"stream"`
		Groups []struct {
			Name string `json:"name"`
		} `json:"groups"`
		Outbox struct {
			ByStatus map[string]int `json:"by_status"`
		} `json:"outbox"`
		Attention []string `json:"attention"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.Slot.Exists)
	require.False(t, rep.Slot.Active)
	require.Greater(t, rep.Slot.LagBytes, int64(50*1000), "the lag covers the WAL written since the slot was made")
	require.Equal(t, stream, rep.Stream.Name)
	require.Len(t, rep.Groups, 1)
	require.Equal(t, "audit", rep.Groups[0].Name)
	require.Equal(t, 50, rep.Outbox.ByStatus["pending"])
	require.NotEmpty(t, rep.Attention)
	require.Contains(t, strings.Join(rep.Attention, "\n"), "inactive")

	text, _, code := run(t, args...)
	require.Equal(t, 3, code)
	require.Contains(t, text, "needs attention")
	require.Contains(t, text, slot)
	require.Contains(t, text, "audit")
}

func TestStatusOfMissingSlotNeedsAttention(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	out, _, code := run(t, "status", "--database-url", db.URL, "--nats-url", ns.URL, "--slot", "nothing_here")
	require.Equal(t, 3, code)
	require.Contains(t, out, "does not exist")
}

// statusStack is a migrated database, a NATS server and `baton relay`
// with short intervals (its heartbeat records the slot's progress every
// 100ms), for the checks of `baton status` that wait before they worry.
type statusStack struct {
	*outbox
	slot      string
	stopRelay func() (int, string)
}

func startStatusStack(t *testing.T) *statusStack {
	t.Helper()
	s := &statusStack{
		outbox: &outbox{t: t, db: testenv.Database(t), nats: testenv.StartNATS(t)},
		slot:   fmt.Sprintf("status_%d_%d", os.Getpid(), slots.Add(1)),
	}
	_, s.js = s.nats.Connect(t)
	_, u, err := schema.CreateToken(context.Background(), s.db.Pool, "watcher")
	require.NoError(t, err)
	s.owner = u.ID
	s.startRelay()
	return s
}

// startRelay starts `baton relay` and waits until it streams from its
// slot.
func (s *statusStack) startRelay() {
	s.t.Helper()
	s.stopRelay = start(s.t, s.args("relay", "--slot", s.slot, "--heartbeat", "100ms", "--status-interval", "100ms",
		"--sweep-interval", "1h", "--sweep-age", "1h")...)
	testenv.Eventually(s.t, 30*time.Second, func() bool {
		return testenv.Count(s.t, s.db.Pool, `
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = $1`, s.slot) == 1
	}, "baton relay streams from slot %s", s.slot)
	// The stall tests measure from the relay's last record of the slot,
	// which it writes at its heartbeats: a relay stopped before its first
	// leaves a slot nobody ever recorded.
	testenv.Eventually(s.t, 30*time.Second, func() bool {
		return testenv.Count(s.t, s.db.Pool, `SELECT count(*) FROM relay_slot_progress WHERE slot_name = $1`, s.slot) == 1
	}, "baton relay recorded slot %s", s.slot)
}

// statusReport is what the stall tests read of `baton status --json`.
type statusReport struct {
	Slot struct {
		Active     bool   `json:"active"`
		StalledFor string `json:"stalled_for"`
		LagBytes   int64  `json:"lag_bytes"`
	} `json:"slot"`
	Groups []struct {
		Name       string `json:"name"`
		Pending    uint64 `json:"pending"`
		StalledFor string `json:"stalled_for"`
	} `json:"groups"`
	Leases struct {
		Expired int `json:"expired"`
		Overdue int `json:"overdue"`
	} `json:"leases"`
	Agents    []schema.AgentEndpoint `json:"agents"`
	Attention []string               `json:"attention"`
}

// status runs `baton status --json` on the stack.
func (s *statusStack) status(args ...string) (statusReport, int) {
	s.t.Helper()
	out, stderr, code := run(s.t, s.args(append([]string{"status", "--json", "--slot", s.slot, "--max-pending-age", "1h"}, args...)...)...)
	var rep statusReport
	require.NoError(s.t, json.Unmarshal([]byte(out), &rep), "status --json printed %q; stderr: %s", out, stderr)
	return rep, code
}

// statusUntil runs `baton status` with flags until done holds of its
// report and exit code, and fails the test after timeout. check, when
// given, sees every run, with the times just before it started and just
// after it ended.
func (s *statusStack) statusUntil(timeout time.Duration, flags []string, check func(before, after time.Time, rep statusReport, code int),
	done func(statusReport, int) bool, format string, args ...any) (statusReport, int) {
	s.t.Helper()
	var rep statusReport
	var code int
	testenv.Eventually(s.t, timeout, func() bool {
		before := time.Now()
		rep, code = s.status(flags...)
		if check != nil {
			check(before, time.Now(), rep, code)
		}
		return done(rep, code)
	}, format, args...)
	return rep, code
}

func attentionAbout(rep statusReport, words ...string) string {
	for _, a := range rep.Attention {
		all := true
		for _, w := range words {
			all = all && strings.Contains(a, w)
		}
		if all {
			return a
		}
	}
	return ""
}

func TestStatusFlagsAConsumerThatStoppedAcknowledgingOnlyAfterStallAfterAndClearsOnceItCatchesUp(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	ctx := context.Background()
	const stallAfter = 5 * time.Second
	stallFlag := []string{"--stall-after", stallAfter.String()}

	stopAudit := start(t, s.args("group", "run", "audit")...)
	s.send("first", 5)
	testenv.Eventually(t, 30*time.Second, func() bool {
		c, err := s.js.Consumer(ctx, batonnats.DefaultStream, group.AuditGroup)
		if err != nil {
			return false // not created yet
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.AckFloor.Stream == 5 && ci.NumAckPending == 0
	}, "the audit group acked the first 5 events")
	code, stderr := stopAudit()
	require.Equal(t, 0, code, stderr)

	// Events wait for a consumer nobody reads, since the stream stored the
	// first of them; the last acknowledgement is older.
	s.send("second", 5)
	s.streamHolds(10)
	st, err := s.js.Stream(ctx, batonnats.DefaultStream)
	require.NoError(t, err)
	first, err := st.GetMsg(ctx, 6)
	require.NoError(t, err)
	waiting := first.Time

	// Each run, however slow the machine: no attention while the events
	// have waited less than --stall-after, attention once they waited
	// longer.
	sawCalm := false
	rep, _ := s.statusUntil(30*time.Second, stallFlag, func(before, after time.Time, rep statusReport, code int) {
		switch code {
		case 0:
			require.Less(t, before.Sub(waiting), stallAfter, "exit 0 only while the events had waited less than --stall-after")
			sawCalm = true
		case 3:
			require.GreaterOrEqual(t, after.Sub(waiting), stallAfter, "attention only once the events waited --stall-after: %v", rep.Attention)
		default:
			t.Fatalf("baton status exited %d: %v", code, rep.Attention)
		}
	}, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the audit consumer's events waited --stall-after %s", stallAfter)
	t.Logf("a run before --stall-after passed saw nothing to flag: %v", sawCalm)
	flag := attentionAbout(rep, "consumer audit", "no acknowledgement", "nobody is pulling", "baton group run audit")
	require.NotEmpty(t, flag, "the stalled consumer is named with what to do: %v", rep.Attention)
	require.Len(t, rep.Attention, 1, "nothing else needs attention: %v", rep.Attention)
	t.Logf("attention: %s", flag)

	text, _, code := run(t, s.args("status", "--slot", s.slot, "--max-pending-age", "1h", "--stall-after", stallAfter.String())...)
	require.Equal(t, 3, code)
	require.Contains(t, text, "consumer audit")

	start(t, s.args("group", "run", "audit")...)
	rep, _ = s.statusUntil(30*time.Second, stallFlag, nil, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 again once the audit group caught up")
	require.Empty(t, rep.Attention)
	// Status is calm as soon as acknowledgements move again, which may be
	// before the last of the ten is in.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return s.consumerInfo(group.AuditGroup).AckFloor.Stream == 10
	}, "the audit group acknowledged all ten events")
}

func TestStatusFlagsASlotWhoseRelayStoppedWhileWALGrowsOnlyAfterStallAfterAndClearsOnceItCatchesUp(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	const stallAfter = 5 * time.Second
	stallFlag := []string{"--stall-after", stallAfter.String()}

	s.send("before", 5)
	rep, _ := s.statusUntil(30*time.Second, stallFlag, nil, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 while the relay streams")
	require.True(t, rep.Slot.Active)

	code, stderr := s.stopRelay()
	require.Equal(t, 0, code, stderr)
	stopped := time.Now()
	// WAL grows behind the slot: messages nobody relays.
	s.send("while-stopped", 20)

	// Each run, however slow the machine: no attention while the slot
	// stood still for less than --stall-after, attention once it stood
	// still longer; and the figure is the relay's: its last record came
	// at most a few heartbeats (100ms) before it stopped.
	sawCalm := false
	rep, _ = s.statusUntil(30*time.Second, stallFlag, func(before, after time.Time, rep statusReport, code int) {
		stalled, err := time.ParseDuration(rep.Slot.StalledFor)
		require.NoError(t, err)
		require.False(t, rep.Slot.Active)
		require.Positive(t, rep.Slot.LagBytes)
		require.LessOrEqual(t, stalled, after.Sub(stopped)+time.Second, "the slot stood still since about when the relay stopped")
		switch code {
		case 0:
			require.Less(t, stalled, stallAfter, "a relay stopped for less than --stall-after needs no attention (it may be restarting): %v", rep.Attention)
			sawCalm = true
		case 3:
			require.GreaterOrEqual(t, stalled, stallAfter, "attention only once the slot stood still for --stall-after: %v", rep.Attention)
		default:
			t.Fatalf("baton status exited %d: %v", code, rep.Attention)
		}
	}, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the slot stood still for --stall-after %s", stallAfter)
	t.Logf("a run before --stall-after passed saw nothing to flag: %v", sawCalm)
	stall := attentionAbout(rep, s.slot, "has not confirmed a new position", "baton relay")
	require.NotEmpty(t, stall, "the stalled slot is named with what to do: %v", rep.Attention)
	t.Logf("attention: %s", stall)

	s.startRelay()
	rep, _ = s.statusUntil(30*time.Second, stallFlag, nil, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 again once the relay caught up")
	require.Empty(t, rep.Attention)
	require.True(t, rep.Slot.Active)
}

func TestStatusFlagsALeaseHeldPastItsExpiryOnlyAfterTheGrace(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	ctx := context.Background()
	const grace = 5 * time.Second
	graceFlag := []string{"--lease-grace", grace.String()}

	c, _, err := schema.CreateConversation(ctx, s.db.Pool, s.owner, "leased", "")
	require.NoError(t, err)
	// A claim whose worker never comes back.
	var claim schema.Claim
	err = pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: s.owner, ConversationID: "leased", MessageID: "m1", Content: "hi"}); err != nil {
			return err
		}
		var err error
		claim, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: c.Key, RunID: "run_gone", Worker: "gone", Lease: 200 * time.Millisecond, MaxAttempts: 3})
		return err
	})
	require.NoError(t, err)
	expiry := claim.LeaseExpiresAt

	sawCalm := false
	rep, _ := s.statusUntil(30*time.Second, graceFlag, func(before, after time.Time, rep statusReport, code int) {
		switch code {
		case 0:
			require.Less(t, before.Sub(expiry), grace, "no attention while the lease expired less than --lease-grace ago")
			require.Zero(t, rep.Leases.Overdue)
			sawCalm = rep.Leases.Expired == 1 || sawCalm
		case 3:
			require.GreaterOrEqual(t, after.Sub(expiry), grace, "attention only once the lease expired --lease-grace ago: %v", rep.Attention)
		default:
			t.Fatalf("baton status exited %d: %v", code, rep.Attention)
		}
	}, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the lease stayed expired for --lease-grace %s", grace)
	t.Logf("a run with the lease expired but within the grace saw nothing to flag: %v", sawCalm)
	require.Equal(t, 1, rep.Leases.Expired)
	require.Equal(t, 1, rep.Leases.Overdue)
	require.NotEmpty(t, attentionAbout(rep, "expired over 5s ago", "baton worker"), "%v", rep.Attention)
}

func TestStatusRefusesANonPositiveStallAfterOrLeaseGrace(t *testing.T) {
	t.Parallel()
	_, stderr, code := run(t, "status", "--database-url", "postgres://x@127.0.0.1/x", "--stall-after", "0s")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--stall-after / BATON_STATUS_STALL_AFTER")
	_, stderr, code = run(t, "status", "--database-url", "postgres://x@127.0.0.1/x", "--lease-grace=-1s")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--lease-grace / BATON_STATUS_LEASE_GRACE")
}
