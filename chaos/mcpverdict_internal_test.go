package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// mcpRun is a small record of a run: what the MCP server received, what
// the journal and the approvals say at the end.
type mcpRun struct {
	calls     []mcpCall
	ops       map[string]mcpOperation
	approvals []mcpApproval
	decided   map[string]string
	faults    []faultRecord
}

// keptRun is a run in which every rule held: a ship call, a refund
// approved and run once, one denied and one expired (neither sent), a
// call judged by time because PostgreSQL was away as it arrived, and a
// worker killed while an approval waited and a call was in flight.
func keptRun() mcpRun {
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	call := func(tool, text, key string, ms int, journal string) mcpCall {
		return mcpCall{tool: tool, text: text, metaKey: key, headerKey: key, worker: "worker1", arrived: at(ms), answered: at(ms + 300), journal: journal}
	}
	return mcpRun{
		calls: []mcpCall{
			call(mcpShip, "s-1", "mcp_a", 100, "started"),
			call(mcpRefund, "r-2", "mcp_b", 5000, "started"),
			call(mcpShip, "s-3", "mcp_c", 6000, journalUnread),
		},
		ops: map[string]mcpOperation{
			"mcp_a": {status: "completed", started: at(90)},
			"mcp_b": {status: "completed", started: at(4990)},
			"mcp_c": {status: "failed", started: at(5990)},
			"mcp_d": {status: "denied", started: at(1000)},
			"mcp_e": {status: "denied", started: at(1000)},
		},
		approvals: []mcpApproval{
			{id: "ap_b", status: "approved", key: "mcp_b", opStatus: "completed", created: at(1000), decided: at(4000), done: 1},
			{id: "ap_d", status: "denied", key: "mcp_d", opStatus: "denied", created: at(1000), decided: at(3000), done: 1},
			{id: "ap_e", status: "expired", key: "mcp_e", opStatus: "denied", created: at(1000), decided: at(12000), done: 1},
		},
		decided: map[string]string{"ap_b": "approved", "ap_d": "denied"},
		faults: []faultRecord{
			{kind: FaultWorkerKill, target: "worker1", at: at(2000)},
			{kind: FaultMCPCallKill, target: "worker1", at: at(6100)},
			{kind: FaultRelayKill, target: "relay1", at: at(6200)},
		},
	}
}

func (r mcpRun) judge() (map[string]*Check, mcpReport) {
	checks, rep := judgeMCP(r.calls, r.ops, r.approvals, r.decided, r.faults)
	out := map[string]*Check{}
	for _, c := range checks {
		out[c.Name] = c
	}
	return out, rep
}

func TestTheMCPVerdictPassesARunThatKeptEveryRule(t *testing.T) {
	t.Parallel()
	checks, rep := keptRun().judge()
	for _, c := range checks {
		require.Zero(t, c.Count, "%s: %v", c.Name, c.Rows)
	}
	require.Equal(t, mcpReport{Calls: 3, Ship: 2, Refund: 1, Keys: 3, InFlightKills: 1, AtArrival: 2, ByTime: 1,
		Asked: 3, Approved: 1, Ran: 1, Denied: 1, Expired: 1, WaitKills: 2, Kills: 2, MostWaiting: 3}, rep)
}

// TestTheMCPVerdictNamesEveryBrokenRule breaks each rule of the MCP
// verdict in turn and expects its check, and only its check, to name the
// offence.
func TestTheMCPVerdictNamesEveryBrokenRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		spoil func(*mcpRun)
		check string
		want  string
	}{
		{"a key that arrives twice", func(r *mcpRun) {
			again := r.calls[0]
			again.arrived = again.arrived.Add(time.Second)
			r.calls = append(r.calls, again)
		}, CheckMCPTwice, "key mcp_a reached the server 2 times"},
		{"one ship sent again under a new key", func(r *mcpRun) {
			again := r.calls[0]
			again.metaKey, again.headerKey, again.arrived = "mcp_f", "mcp_f", again.arrived.Add(time.Second)
			r.calls = append(r.calls, again)
			r.ops["mcp_f"] = mcpOperation{status: "completed", started: again.arrived.Add(-time.Millisecond)}
		}, CheckMCPTwice, "ship s-1 reached the server under 2 keys: mcp_a, mcp_f"},
		{"a call without its header key", func(r *mcpRun) { r.calls[0].headerKey = "" }, CheckMCPTwice, `with the _meta key "mcp_a" and the Idempotency-Key header ""`},
		{"a call that arrives before its journal", func(r *mcpRun) { r.calls[0].journal = "" }, CheckMCPJournal, "(key mcp_a) arrived with no operation journaled"},
		{"a call started after it arrived", func(r *mcpRun) {
			r.ops["mcp_c"] = mcpOperation{status: "failed", started: r.calls[2].arrived.Add(time.Millisecond)}
		}, CheckMCPJournal, "(key mcp_c) arrived before its operation was started"},
		{"a call sent while its approval waits", func(r *mcpRun) { r.calls[1].journal = "awaiting_approval" }, CheckMCPApproval, "sent without an approval"},
		{"a denied call that arrives", func(r *mcpRun) {
			r.calls = append(r.calls, mcpCall{tool: mcpRefund, text: "r-4", metaKey: "mcp_d", headerKey: "mcp_d", journal: "started"})
		}, CheckMCPApproval, "denied call of approval ap_d (key mcp_d) reached the server 1 times"},
		{"an expired call journaled as sent", func(r *mcpRun) { r.approvals[2].opStatus = "started" }, CheckMCPApproval, "the call of expired approval ap_e is journaled started, not denied"},
		{"an approved call completed that never arrived", func(r *mcpRun) { r.calls = r.calls[:1] }, CheckMCPApproval, "approved call of ap_b (key mcp_b) is journaled completed but never reached the server"},
		{"a turn answered without its approved call", func(r *mcpRun) { r.approvals[0].opStatus = "awaiting_approval"; r.calls = r.calls[:1] }, CheckMCPApproval, "the turn of approval ap_b was answered, but its approved call is awaiting_approval"},
		{"a decision the database does not keep", func(r *mcpRun) { r.decided["ap_d"] = "approved" }, CheckMCPApproval, "approval ap_d was answered approved to its user but is denied in the database"},
		{"a decided approval whose turn is still open", func(r *mcpRun) { r.approvals[1].open = 1 }, CheckMCPWaiting, "approval ap_d was denied at 12:00:03.000, but 1 of its turn's rows are still open"},
		{"an approval still pending", func(r *mcpRun) { r.approvals[2].status = "pending"; r.approvals[2].open = 1 }, CheckMCPWaiting, "approval ap_e still waits after the run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := keptRun()
			tc.spoil(&r)
			checks, _ := r.judge()
			for name, c := range checks {
				if name != tc.check {
					require.Zero(t, c.Count, "only %q fails, not %s: %v", tc.check, name, c.Rows)
					continue
				}
				require.NotZero(t, c.Count, "%s must fail", name)
				require.True(t, strings.Contains(strings.Join(c.Rows, "\n"), tc.want), "%s names %q:\n%s", name, tc.want, strings.Join(c.Rows, "\n"))
			}
		})
	}
}

// TestAnApprovedCallAStopKeptFromRunningKeepsItsApproval: a stop that
// comes after a call was approved, before its turn went on, settles the
// turn's rows and records the call as never sent; the verdict counts it,
// and names it only when the call was denied without a stop.
func TestAnApprovedCallAStopKeptFromRunningKeepsItsApproval(t *testing.T) {
	t.Parallel()
	r := keptRun()
	r.calls = r.calls[:1]
	r.approvals[0].opStatus, r.approvals[0].done, r.approvals[0].stopped = "denied", 0, 1
	checks, rep := r.judge()
	require.Zero(t, checks[CheckMCPApproval].Count, "%v", checks[CheckMCPApproval].Rows)
	require.Equal(t, 1, rep.Stopped)

	r.approvals[0].stopped = 0
	checks, _ = r.judge()
	require.Equal(t, []string{"approved call of ap_b (key mcp_b) was not sent after all"}, checks[CheckMCPApproval].Rows)
}
