package chaos_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/chaos"
	"github.com/batonhq/baton/internal/testenv"
)

// run runs the harness and returns its result and printed summary.
func run(t *testing.T, cfg chaos.Config) (*chaos.Result, string) {
	t.Helper()
	var out bytes.Buffer
	cfg.Out = &out
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, cfg)
	require.NoError(t, err, "the harness could not run:\n%s", out.String())
	res.WriteSummary(&out)
	return res, out.String()
}

// TestShortChaosRunKeepsEveryInvariant is `make chaos` small: every fault
// kind once, the network faults among them, over a few hundred messages,
// with the workers' default 30 s lease.
func TestShortChaosRunKeepsEveryInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes for about a minute")
	}
	res, summary := run(t, chaos.Config{
		Binary:        testenv.PlainBatonBinary(t),
		Seed:          20260601,
		Conversations: 30,
		Messages:      300,
		Plan:          chaos.AllFaults,
		LoadDuration:  60 * time.Second,
		SettleTimeout: time.Minute,
	})
	t.Log("\n" + summary)
	require.True(t, res.Passed(), "every invariant holds through every kind of fault:\n%s", summary)
	require.Len(t, res.Faults, len(chaos.AllFaults))
	// The run went on on the promoted standby, which the processes found
	// on their multi-host URL, with a new synchronous standby of its own.
	require.Regexp(t, `fault postgres_failover +pg1 +pg1 killed, pg2 promoted in .*; new synchronous standby pg3`, summary)
	require.Regexp(t, `status after the run +exit 0, server 127\.0\.0\.1:\d+ \(pg2\), timeline 2, slot \S+ read by a relay, standby pg3 streaming sync`, summary)
	require.Regexp(t, `fault postgres_standby_pause +pg[23] +WAL receiver stopped for .*: up to [1-9]\d* commits waited`, summary)
	require.Regexp(t, `unexpected exits +none`, summary, "every process rides every fault out: none exits")
	for _, k := range chaos.NetworkFaults {
		require.Regexp(t, `\n  `+string(k)+` .*then healed; heal -> next turn \d`, summary, "each network fault is healed and followed by a turn")
	}
	// The turns called the MCP server's tools through the workers' MCP
	// client; a worker was killed while the server held one of its
	// calls, another call's connection was dropped; refunds waited for
	// approvals that the load gave, refused and left to expire while
	// workers were killed.
	require.Regexp(t, `fault mcp_call_kill +worker\d +SIGKILL while its (ship|refund) call \(key mcp_[0-9a-f]{32}\) was held by the server`, summary)
	require.Regexp(t, `fault mcp_call_drop +worker\d +connection of a (ship|refund) call \(key mcp_[0-9a-f]{32}\) dropped after it arrived`, summary)
	require.Regexp(t, `MCP calls +[1-9]\d* received \(chaos__ship [1-9]\d*, chaos__refund [1-9]\d*\) under \d+ keys; 1 dropped and 1 held by a fault, [1-9]\d* in flight when their worker was killed`, summary)
	require.Regexp(t, `MCP journal +[1-9]\d* journaled as started when they arrived`, summary)
	require.Regexp(t, `approvals +\d+ asked: [1-9]\d* approved \([1-9]\d* ran once, .*\), [1-9]\d* denied, [1-9]\d* expired, 0 pending`, summary)
	require.Regexp(t, `kills while approvals waited +[1-9]\d* of \d+ worker kills`, summary)
}

// TestHarnessFailsABrokenWorker runs the harness against a worker built
// with the chaosbroken tag, which breaks three rules at once: its finalize
// marks rows done in one transaction and writes the reply in the next, its
// MCP client sends a call again after its connection dropped, and its
// journal sends an MCP call before it commits it as started. A worker
// killed between the two finalize transactions, and calls whose
// connections are dropped, must make the verdict fail, naming the done
// rows without a reply, the key that arrived twice and the calls that
// arrived with no operation journaled. (One run for the three: each
// breakage is seen by a check of its own.)
func TestHarnessFailsABrokenWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes for about a minute")
	}
	res, summary := run(t, chaos.Config{
		Binary:        testenv.ChaosBrokenBatonBinary(t),
		Seed:          20260602,
		Conversations: 20,
		Messages:      150,
		Plan: []chaos.FaultKind{
			chaos.FaultCrashAfterFinalizeBefore, chaos.FaultMCPCallDrop,
			chaos.FaultCrashAfterFinalizeBefore, chaos.FaultMCPCallDrop,
			chaos.FaultCrashAfterFinalizeBefore,
		},
		LoadDuration:  20 * time.Second,
		SettleTimeout: 30 * time.Second,
	})
	t.Log("\n" + summary)
	defer os.RemoveAll(res.Dir)
	require.False(t, res.Passed(), "a broken worker must fail the run:\n%s", summary)
	require.Contains(t, summary, "FAILED: "+chaos.CheckDoneNoReply, "the verdict names the done rows that have no reply")
	require.Regexp(t, `FAILED: `+chaos.CheckMCPTwice+` \(\d+\):\n  key mcp_[0-9a-f]{32} reached the server 2 times`, summary, "the verdict names the key that arrived twice")
	require.Regexp(t, `FAILED: `+chaos.CheckMCPJournal+` \(\d+\):\n  (ship|refund) .* arrived with no operation journaled`, summary, "the verdict names the calls sent before their journal")
}
