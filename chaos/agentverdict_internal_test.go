package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// agentRun is a small record of a run with agents: what the recorders
// received, the stops the load asked for, the visible errors and the
// faults.
type agentRun struct {
	reqs   []stepRequest
	stops  []stopRecord
	keys   map[string]string
	errs   []visibleError
	faults []faultRecord
}

// keptAgentRun is a run in which every rule held: a step that called a
// tool and the next one; a step posted again after a 502 with the same
// run id; a step held while its worker was killed, posted again by
// another worker with the same run id; a stop that closed the request
// open then; a clean error while an agent was down.
func keptAgentRun() agentRun {
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	req := func(conv, turn string, step int, run, worker string, from, to int, end string) stepRequest {
		return stepRequest{agent: "mastra", worker: worker, runID: run, key: run, conversation: conv, turn: turn, step: step,
			arrived: at(from), ended: at(to), end: end}
	}
	return agentRun{
		reqs: []stepRequest{
			req("c_1", "t1", 0, "step_a", "worker1", 100, 200, endAnswered),
			req("c_1", "t1", 1, "step_b", "worker1", 400, 450, endAgentFailed),
			req("c_1", "t1", 1, "step_b", "worker1", 900, 1000, endAnswered),
			{agent: "ai-sdk", worker: "worker2", runID: "step_c", key: "step_c", conversation: "c_2", turn: "t2", arrived: at(2000), ended: at(2100), end: endHeld, held: true},
			req("c_2", "t2", 0, "step_c", "worker3", 3000, 3100, endAnswered),
			req("c_3", "t3", 0, "step_d", "worker1", 20000, 20600, endClosed),
		},
		stops: []stopRecord{
			{conversation: "conv-3", sent: at(20400), answered: at(20500), stopped: true},
			{conversation: "conv-1", sent: at(30000), answered: at(30010)},
		},
		keys: map[string]string{"conv-1": "c_1", "conv-2": "c_2", "conv-3": "c_3"},
		errs: []visibleError{
			{conversation: "conv-4", id: "error_1", created: at(11000),
				content: "The assistant's agent service is not responding. Press Retry or send your message again later. (Reference: run_0190-ab)"},
		},
		faults: []faultRecord{
			{kind: FaultAgentStepKill, target: "worker2", at: at(2100), runID: "step_c", began: at(1900), took: time.Second},
			{kind: FaultAgentDown, target: "agent1", at: at(10000), began: at(10000), took: 6 * time.Second, healed: at(16000)},
		},
	}
}

func (r agentRun) judge() (map[string]*Check, agentReport) {
	checks, rep := judgeAgents(r.reqs, r.stops, r.keys, r.errs, r.faults, 30*time.Second)
	out := map[string]*Check{}
	for _, c := range checks {
		out[c.Name] = c
	}
	return out, rep
}

// TestTheAgentVerdictNamesEveryBrokenRule judges a run in which every
// rule held, then the same run with one rule broken at a time: each
// breakage must fail its own check, and only that one, naming the
// offence.
func TestTheAgentVerdictNamesEveryBrokenRule(t *testing.T) {
	t.Parallel()
	checks, rep := keptAgentRun().judge()
	for name, c := range checks {
		require.Zero(t, c.Count, "%s fails a run that kept every rule: %v", name, c.Rows)
	}
	require.Equal(t, map[string]int{"mastra": 5, "ai-sdk": 1}, rep.Requests)
	require.Equal(t, [3]int{4, 2, 1}, [3]int{rep.Steps, rep.Again, rep.Closed})
	require.Equal(t, [2]int{1, 1}, [2]int{rep.Held, rep.Reposted}, "the held step was posted again with its run id")
	require.Equal(t, [4]int{2, 1, 1, 1}, [4]int{rep.Stops, rep.Stopped, rep.Open, rep.Strict})
	require.Equal(t, [3]int{1, 1, 1}, [3]int{rep.Errors, rep.AgentErrors, rep.DownErrors})

	t0 := keptAgentRun().reqs[0].arrived.Add(-100 * time.Millisecond)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name   string
		check  string
		break_ func(r *agentRun)
		names  string
	}{
		{"a re-claim posts a step under a new run id", CheckAgentRunID, func(r *agentRun) {
			r.reqs[4].runID, r.reqs[4].key = "step_c2", "step_c2"
		}, "step 0 of turn t2 of c_2 (epoch 0) was posted under 2 run ids: step_c, step_c2"},
		{"an Idempotency-Key that is not the run id", CheckAgentRunID, func(r *agentRun) {
			r.reqs[0].key = "other"
		}, `came with the run id "step_a" and the Idempotency-Key "other"`},
		{"two steps share a run id", CheckAgentRunID, func(r *agentRun) {
			r.reqs[1].runID, r.reqs[1].key = "step_a", "step_a"
			r.reqs[2].runID, r.reqs[2].key = "step_a", "step_a"
		}, "run id step_a was posted for 2 different steps"},
		{"an answered step is posted again", CheckAgentAnswered, func(r *agentRun) {
			r.reqs[2].journal = stepJournalAnswered
		}, "step 1 of turn t1 of c_1 (run id step_b) from worker1 to mastra at 12:00:00.900 arrived when its answer was journaled already"},
		{"a step of an answered turn is posted", CheckAgentAnswered, func(r *agentRun) {
			r.reqs[2].journal = stepJournalReplied
		}, "arrived when its turn was answered already"},
		{"a stop leaves the request to the agent's end", CheckAgentStop, func(r *agentRun) {
			r.reqs[5].end, r.reqs[5].ended = endAnswered, at(22000)
		}, "went on to the agent's end 1.5s after a stop answered at 12:00:20.500: the worker never closed it"},
		{"a stop leaves the request open", CheckAgentStop, func(r *agentRun) {
			r.reqs[5].end = endOpen
		}, "was still open at the end of the run, after a stop answered at 12:00:20.500"},
		{"a step of a stopped turn is posted after the stop", CheckAgentStop, func(r *agentRun) {
			r.reqs = append(r.reqs, stepRequest{agent: "mastra", worker: "worker1", runID: "step_e", key: "step_e", conversation: "c_3", turn: "t3", step: 1, arrived: at(21000), ended: at(21100), end: endAnswered})
		}, "step 1 of turn t3 of c_3 (run id step_e) from worker1 to mastra at 12:00:21.000 was posted after a stop of its turn answered at 12:00:20.500"},
		{"an error shows the agent's URL", CheckAgentErrors, func(r *agentRun) {
			r.errs[0].content = "The assistant's agent service is not responding: dial tcp 198.18.0.1:4000: connection refused (Reference: run_1)"
		}, "error error_1 of conversation conv-4 reads"},
		{"an error is a driver's message", CheckAgentErrors, func(r *agentRun) {
			r.errs[0].content = "unexpected EOF"
		}, `reads "unexpected EOF"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := keptAgentRun()
			c.break_(&r)
			checks, _ := r.judge()
			for name, ch := range checks {
				if name == c.check {
					require.Equal(t, 1, ch.Count, "%s names the offence once: %v", name, ch.Rows)
					require.Contains(t, ch.Rows[0], c.names)
					continue
				}
				require.Zero(t, ch.Count, "only %s fails, not %s: %v", c.check, name, ch.Rows)
			}
		})
	}
}
