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
	s.eventually(30*time.Second, func() bool {
		return s.count(`
			SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = $1`, s.slot) == 1
	}, "baton relay streams from slot %s", s.slot)
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
	Attention []string `json:"attention"`
}

// status runs `baton status --json` on the stack.
func (s *statusStack) status(args ...string) (statusReport, int) {
	s.t.Helper()
	out, stderr, code := run(s.t, s.args(append([]string{"status", "--json", "--slot", s.slot, "--max-pending-age", "1h"}, args...)...)...)
	var rep statusReport
	require.NoError(s.t, json.Unmarshal([]byte(out), &rep), "status --json printed %q; stderr: %s", out, stderr)
	return rep, code
}

// statusUntil runs `baton status` with flags until cond holds of its
// report and exit code, and fails the test after timeout.
func (s *statusStack) statusUntil(timeout time.Duration, flags []string, cond func(statusReport, int) bool, format string, args ...any) (statusReport, int) {
	s.t.Helper()
	var rep statusReport
	var code int
	s.eventually(timeout, func() bool {
		rep, code = s.status(flags...)
		return cond(rep, code)
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
	const stallAfter = 2 * time.Second
	stallFlag := []string{"--stall-after", stallAfter.String()}

	stopAudit := start(t, s.args("group", "run", "audit")...)
	s.send("first", 5)
	s.eventually(30*time.Second, func() bool {
		c, err := s.js.Consumer(context.Background(), batonnats.DefaultStream, group.AuditGroup)
		if err != nil {
			return false // not created yet
		}
		ci, err := c.Info(context.Background())
		return err == nil && ci.AckFloor.Stream == 5 && ci.NumAckPending == 0
	}, "the audit group acked the first 5 events")
	code, stderr := stopAudit()
	require.Equal(t, 0, code, stderr)

	// Events wait for a consumer nobody reads.
	s.send("second", 5)
	stored := s.streamHolds(10)
	rep, code := s.status(stallFlag...)
	require.Less(t, time.Since(stored), stallAfter, "the machine is too slow for this test's timing")
	require.Equal(t, 0, code, "events that wait for less than --stall-after need no attention: %v", rep.Attention)

	rep, _ = s.statusUntil(30*time.Second, stallFlag, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the audit consumer's events waited --stall-after %s", stallAfter)
	require.GreaterOrEqual(t, time.Since(stored), stallAfter, "flagged no earlier than --stall-after")
	flag := attentionAbout(rep, "consumer audit", "no acknowledgement", "nobody is pulling", "baton group run audit")
	require.NotEmpty(t, flag, "the stalled consumer is named with what to do: %v", rep.Attention)
	require.Len(t, rep.Attention, 1, "nothing else needs attention: %v", rep.Attention)
	t.Logf("attention: %s", flag)

	text, _, code := run(t, s.args("status", "--slot", s.slot, "--max-pending-age", "1h", "--stall-after", stallAfter.String())...)
	require.Equal(t, 3, code)
	require.Contains(t, text, "consumer audit")

	start(t, s.args("group", "run", "audit")...)
	rep, _ = s.statusUntil(30*time.Second, stallFlag, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 again once the audit group caught up")
	require.Empty(t, rep.Attention)
	require.EqualValues(t, 10, s.consumerInfo(group.AuditGroup).AckFloor.Stream)
}

func TestStatusFlagsASlotWhoseRelayStoppedWhileWALGrowsOnlyAfterStallAfterAndClearsOnceItCatchesUp(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	const stallAfter = 2 * time.Second
	stallFlag := []string{"--stall-after", stallAfter.String()}

	s.send("before", 5)
	rep, _ := s.statusUntil(30*time.Second, stallFlag, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 while the relay streams")
	require.True(t, rep.Slot.Active)

	code, stderr := s.stopRelay()
	require.Equal(t, 0, code, stderr)
	stopped := time.Now()
	// WAL grows behind the slot: messages nobody relays.
	s.send("while-stopped", 20)
	rep, code = s.status(stallFlag...)
	require.Less(t, time.Since(stopped), stallAfter, "the machine is too slow for this test's timing")
	require.False(t, rep.Slot.Active)
	require.Positive(t, rep.Slot.LagBytes)
	require.Equal(t, 0, code, "a relay stopped for less than --stall-after needs no attention (it may be restarting): %v", rep.Attention)

	rep, _ = s.statusUntil(30*time.Second, stallFlag, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the slot stood still for --stall-after %s", stallAfter)
	require.GreaterOrEqual(t, time.Since(stopped), stallAfter, "flagged no earlier than --stall-after")
	stall := attentionAbout(rep, s.slot, "has not confirmed a new position", "baton relay")
	require.NotEmpty(t, stall, "the stalled slot is named with what to do: %v", rep.Attention)
	require.NotEmpty(t, attentionAbout(rep, s.slot, "inactive", "no relay has looked at it"), "%v", rep.Attention)
	t.Logf("attention: %s", stall)

	s.startRelay()
	rep, _ = s.statusUntil(30*time.Second, stallFlag, func(rep statusReport, code int) bool { return code == 0 },
		"baton status exits 0 again once the relay caught up")
	require.Empty(t, rep.Attention)
	require.True(t, rep.Slot.Active)
}

func TestStatusFlagsALeaseHeldPastItsExpiryOnlyAfterTheGrace(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	ctx := context.Background()
	const grace = 2 * time.Second

	c, _, err := schema.CreateConversation(ctx, s.db.Pool, s.owner, "leased", "")
	require.NoError(t, err)
	// A claim whose worker never comes back.
	err = pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: s.owner, ConversationID: "leased", MessageID: "m1", Content: "hi"}); err != nil {
			return err
		}
		_, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: c.Key, RunID: "run_gone", Worker: "gone", Lease: 200 * time.Millisecond, MaxAttempts: 3})
		return err
	})
	require.NoError(t, err)
	s.eventually(10*time.Second, func() bool {
		return s.count(`SELECT count(*) FROM conversations WHERE lease_expires_at < now()`) == 1
	}, "the lease expired")
	expired := time.Now()

	rep, code := s.status("--lease-grace", grace.String())
	require.Less(t, time.Since(expired), grace, "the machine is too slow for this test's timing")
	require.Equal(t, 1, rep.Leases.Expired)
	require.Zero(t, rep.Leases.Overdue)
	require.Equal(t, 0, code, "a lease expired for less than --lease-grace needs no attention (recovery runs every half lease): %v", rep.Attention)

	rep, _ = s.statusUntil(30*time.Second, []string{"--lease-grace", grace.String()}, func(rep statusReport, code int) bool { return code == 3 },
		"baton status exits 3 once the lease stayed expired for --lease-grace %s", grace)
	require.GreaterOrEqual(t, time.Since(expired), grace, "flagged no earlier than --lease-grace")
	require.Equal(t, 1, rep.Leases.Overdue)
	require.NotEmpty(t, attentionAbout(rep, "expired over 2s ago", "baton worker"), "%v", rep.Attention)
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
