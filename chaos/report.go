package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteSummary prints the run's table, then every failed check with the
// rows it names.
func (r *Result) WriteSummary(w io.Writer) {
	v := r.Verdict
	counts := map[FaultKind]int{}
	notes := map[FaultKind]int{}
	for _, f := range r.Faults {
		counts[f.kind]++
		if f.note == "died at the crash point" {
			notes[f.kind]++
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	fmt.Fprintln(tw, "CHAOS SUMMARY\t")
	row("seed", "%d", r.Config.Seed)
	row("time", "load %s, settle %s, total %s", r.Load.Round(time.Second), r.Settle.Round(100*time.Millisecond), r.Total.Round(time.Second))
	row("conversations", "%d (%d deleted mid-turn)", r.Conversations, r.Deleted)
	row("messages sent", "%d: %d accepted, %d refused (conversation deleted), %d posted more than once", r.Sent, r.Accepted, r.Rejected, r.Retried)
	row("API answers retried", "%s", formatStatuses(r.AnswersRetried))
	row("turns", "%d replied, %d failed visibly, %d messages settled by a stop while they waited", v.RepliedTurns, v.FailedTurns, v.SettledByStop)
	row("messages stored", "%d user, %d assistant, %d error", v.UserMessages, v.Replies, v.Errors)
	row("runs", "%s", formatRuns(v.Runs))
	row("side effects (notify)", "%d", v.SideEffects)
	row("MCP calls", "%s", r.MCP.calls())
	row("MCP journal", "%s", r.MCP.journal())
	row("approvals", "%s", r.MCP.approvals())
	row("kills while approvals waited", "%s", r.MCP.waitKills())
	if len(r.Config.Agents) > 0 {
		row("agents", "%s", strings.Join(r.Config.Agents, ", "))
		row("agent step requests", "%s", r.Agents.requests())
		row("stops", "%s", r.Agents.stops())
		row("errors", "%s", r.Agents.errors())
	}
	row("faults injected", "%d", len(r.Faults))
	for _, k := range append(append(slices.Clone(AllFaults), ExtraFaults...), AgentFaults...) {
		if (slices.Contains(ExtraFaults, k) || slices.Contains(AgentFaults, k) && len(r.Config.Agents) == 0) && counts[k] == 0 {
			continue
		}
		if _, ok := k.crashPoint(); ok {
			row("  "+string(k), "%d (%d died at the point)", counts[k], notes[k])
			continue
		}
		row("  "+string(k), "%d", counts[k])
	}
	row("unexpected exits", "%s", formatExits(r.Unexpected))
	for _, c := range v.Checks {
		row(c.Name, "%d", c.Count)
	}
	row("settled", "%v", r.Settled)
	row("status after the run", "%s", r.Status)
	row("triggers in the stream", "%s", r.Triggers)
	row("live event streams", "%s", r.Streams)
	row("longest kill -> next turn", "%s (after %s; %d faults with no turn after them)", v.LongestRecovery.Round(time.Millisecond), v.LongestRecoveryAfter, v.NoTurnAfter)
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	row("verdict", "%s", verdict)
	tw.Flush()
	var healed []string
	for _, f := range r.Faults {
		if f.healed.IsZero() {
			continue
		}
		next := "no turn after it"
		if f.healToTurn > 0 {
			next = f.healToTurn.Round(time.Millisecond).String()
		}
		healed = append(healed, fmt.Sprintf("  %-22s %-8s %s; heal -> next turn %s", f.kind, f.target, firstLine(f.note), next))
	}
	if len(healed) > 0 {
		fmt.Fprintf(w, "\nnetwork faults (heal -> next finalized turn):\n%s\n", strings.Join(healed, "\n"))
	}
	if len(r.Agents.NotReposted) > 0 {
		fmt.Fprintf(w, "\nsteps held across their worker's kill and not posted again:\n")
		for _, e := range r.Agents.NotReposted {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if len(r.Triggers.Examples) > 0 {
		fmt.Fprintf(w, "\ntriggers in the stream that do not match the database (harmless to turns, see TriggerAudit):\n")
		for _, e := range r.Triggers.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	for _, c := range v.Checks {
		if c.Count == 0 {
			continue
		}
		fmt.Fprintf(w, "\nFAILED: %s (%d):\n", c.Name, c.Count)
		for _, s := range c.Rows {
			fmt.Fprintf(w, "  %s\n", s)
		}
		if c.Count > len(c.Rows) {
			fmt.Fprintf(w, "  ... and %d more\n", c.Count-len(c.Rows))
		}
	}
	if !r.Passed() {
		fmt.Fprintf(w, "\nlogs of every process: %s/logs (replay with --seed %d)\n", r.Dir, r.Config.Seed)
	}
}

func formatRuns(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func formatStatuses(m map[int]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var parts []string
	for _, k := range keys {
		if k == 0 {
			parts = append(parts, fmt.Sprintf("no answer: %d", m[k]))
			continue
		}
		parts = append(parts, fmt.Sprintf("%d: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func formatExits(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
