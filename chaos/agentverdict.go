package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Check names of the external agents' part of the verdict.
const (
	CheckAgentRunID    = "step requests whose run id is not their step's"
	CheckAgentAnswered = "steps posted again after they were answered"
	CheckAgentErrors   = "visible errors that are not clean"
	CheckAgentStop     = "stops that left a request open or posted a step after them"
)

// stopGrace is how long after a stop's answer a request open then may
// still end by itself (the agent's answer ending as the worker closes
// it); stopClose bounds when the worker must have closed it, when no
// fault was about then.
const (
	stopGrace = 500 * time.Millisecond
	stopClose = 3 * time.Second
)

// cleanError is what a visible error may look like: the sentences Baton
// writes for users, which start with what happened to the assistant (or
// its model), and end with a reference an operator can look up.
var cleanError = regexp.MustCompile(`^The (assistant|assistant's|model) [^{}<>\n]+ \(Reference: [A-Za-z0-9_-]+\)$`)

// uncleanWords are what no user's error may hold: a URL, a step's run id,
// a token, a Go or Node error.
var uncleanWords = []string{"://", "step_", "Bearer", "eyJ", ".go:", "goroutine", "ECONNREFUSED", "EOF", "dial tcp", "context deadline", "Idempotency-Key"}

// visibleError is an error message as stored.
type visibleError struct {
	conversation, id, content string
	created                   time.Time
}

// loadAgentFacts reads what the agents' verdict needs of the database:
// every visible error, and the conversations' keys by the load's ids.
func loadAgentFacts(ctx context.Context, pool *pgxpool.Pool) ([]visibleError, map[string]string, error) {
	var errs []visibleError
	rows, err := pool.Query(ctx, `
		SELECT c.public_id, m.id, m.content, m.created_at FROM messages m JOIN conversations c ON c.id = m.conversation_id
		WHERE m.role = 'error' ORDER BY m.created_at`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var e visibleError
		if err := rows.Scan(&e.conversation, &e.id, &e.content, &e.created); err != nil {
			rows.Close()
			return nil, nil, err
		}
		errs = append(errs, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	keys := map[string]string{}
	if err := eachRow(ctx, pool, `SELECT public_id, id FROM conversations`, func(s []string) { keys[s[0]] = s[1] }); err != nil {
		return nil, nil, err
	}
	return errs, keys, nil
}

// agentReport is what the summary says of the step requests, the stops
// and the agents' faults.
type agentReport struct {
	// Requests the recorders received, by agent; Steps distinct run ids.
	Requests map[string]int
	Steps    int
	// Again were requests of a run id seen before (retries, re-claims),
	// Closed closed by their worker, AgentFailed broken off by the agent.
	Again, Closed, AgentFailed int
	// Held are the requests agent_step_kill held while their worker was
	// killed; Reposted were posted again afterwards with the same run
	// id.
	Held, Reposted int
	// NotReposted says, of each held step not posted again, what came
	// of its conversation instead.
	NotReposted []string
	// Stops asked, Stopped of them stopped a running turn, Open requests
	// open at those, Strict stops judged by the strict bound, and
	// Longest from a stop's answer to the close of a request open then.
	Stops, Stopped, Open, Strict int
	Longest                      time.Duration
	// Errors are the visible errors, AgentErrors of them the agent's
	// (unavailable, stopped responding, failed) and DownErrors those
	// that agent_down caused (while an agent was down).
	Errors, AgentErrors, DownErrors int
}

func (r agentReport) requests() string {
	var names []string
	for n := range r.Requests {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, r.Requests[n]))
	}
	return fmt.Sprintf("%s, for %d steps; %d posted again with the same run id, %d closed by their worker, %d broken off by the agent; %d held across their worker's kill, %d of them posted again with the same run id",
		strings.Join(parts, ", "), r.Steps, r.Again, r.Closed, r.AgentFailed, r.Held, r.Reposted)
}

func (r agentReport) stops() string {
	return fmt.Sprintf("%d asked, %d stopped a running turn, %d requests open then, all closed (longest %s after the stop), %d judged by the %s bound",
		r.Stops, r.Stopped, r.Open, r.Longest.Round(time.Millisecond), r.Strict, stopClose)
}

func (r agentReport) errors() string {
	return fmt.Sprintf("%d visible, all clean; %d of them the agent's, %d while an agent was down past the retries", r.Errors, r.AgentErrors, r.DownErrors)
}

// agentErrorTexts start the errors that say the agent failed.
var agentErrorTexts = []string{
	"The assistant's agent service is not responding.",
	"The assistant's agent service stopped responding.",
	"The assistant's agent service failed while answering.",
	"The assistant could not answer after",
	"The assistant stopped after",
}

// judgeAgents checks the step requests the recorders received, the
// stops and the visible errors: every request's Idempotency-Key is its
// run id, and a run id names one step (one conversation, turn, epoch and
// step) and a step one run id, so that a re-posted step carries the same
// one; no step was posted once its answer was journaled or its turn
// answered; every stop that found a turn running closed the requests
// open then, and no step of that turn followed; every visible error is
// one of Baton's sentences for users, with no URL, run id, token or
// driver error in it.
func judgeAgents(reqs []stepRequest, stops []stopRecord, keys map[string]string, errs []visibleError, faults []faultRecord, lease time.Duration) ([]*Check, agentReport) {
	runIDs := &Check{Name: CheckAgentRunID}
	answered := &Check{Name: CheckAgentAnswered}
	unclean := &Check{Name: CheckAgentErrors}
	stopped := &Check{Name: CheckAgentStop}
	r := agentReport{Requests: map[string]int{}}
	describe := func(q stepRequest) string {
		return fmt.Sprintf("step %d of turn %s of %s (run id %s) from %s to %s at %s", q.step, q.turn, q.conversation, q.runID, q.worker, q.agent, q.arrived.Format("15:04:05.000"))
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].arrived.Before(reqs[j].arrived) })

	type stepID struct {
		conversation, turn string
		epoch, step        int
	}
	byStep := map[stepID]map[string]bool{}
	byRun := map[string]map[stepID]bool{}
	seen := map[string]bool{}
	for _, q := range reqs {
		r.Requests[q.agent]++
		if seen[q.runID] {
			r.Again++
		}
		seen[q.runID] = true
		switch q.end {
		case endClosed:
			r.Closed++
		case endAgentFailed:
			r.AgentFailed++
		}
		if q.runID == "" || q.key != q.runID {
			runIDs.add("%s came with the run id %q and the Idempotency-Key %q", describe(q), q.runID, q.key)
		}
		id := stepID{q.conversation, q.turn, q.epoch, q.step}
		if byStep[id] == nil {
			byStep[id] = map[string]bool{}
		}
		byStep[id][q.runID] = true
		if byRun[q.runID] == nil {
			byRun[q.runID] = map[stepID]bool{}
		}
		byRun[q.runID][id] = true
		switch q.journal {
		case stepJournalAnswered:
			answered.add("%s arrived when its answer was journaled already", describe(q))
		case stepJournalReplied:
			answered.add("%s arrived when its turn was answered already", describe(q))
		}
	}
	r.Steps = len(seen)
	for id, runs := range byStep {
		if len(runs) > 1 {
			runIDs.add("step %d of turn %s of %s (epoch %d) was posted under %d run ids: %s", id.step, id.turn, id.conversation, id.epoch, len(runs), strings.Join(sortedKeys(runs), ", "))
		}
	}
	for run, ids := range byRun {
		if len(ids) > 1 {
			runIDs.add("run id %s was posted for %d different steps", run, len(ids))
		}
	}

	// The steps held across their worker's kill: the same step must come
	// again with the same run id (the checks above), and the summary
	// counts those that did.
	for _, f := range faults {
		if f.kind != FaultAgentStepKill || f.failed || f.runID == "" {
			continue
		}
		r.Held++
		var held *stepRequest
		reposted := false
		for i, q := range reqs {
			if q.runID == f.runID && q.held {
				held = &reqs[i]
			}
			if q.runID == f.runID && q.arrived.After(f.at) {
				reposted = true
			}
		}
		if reposted {
			r.Reposted++
			continue
		}
		next := "no request of its conversation followed"
		if held != nil {
			for _, q := range reqs {
				if q.conversation == held.conversation && q.arrived.After(f.at) {
					next = fmt.Sprintf("its conversation's next request was step %d of turn %s", q.step, q.turn)
					break
				}
			}
		}
		r.NotReposted = append(r.NotReposted, fmt.Sprintf("run id %s, held at %s: %s", f.runID, f.at.Format("15:04:05.000"), next))
	}

	// Stops: a stop that found a turn running ends the requests of the
	// conversation open when it was answered, and no step of their turn
	// is posted after it. The worker hears of a stop from a NATS notice
	// at once, or from PostgreSQL at its next lease renewal: the strict
	// bound holds only when no fault was about.
	for _, st := range stops {
		r.Stops++
		if !st.stopped {
			continue
		}
		r.Stopped++
		key := keys[st.conversation]
		if key == "" {
			continue // deleted since
		}
		strict := !faultAbout(faults, st.sent.Add(-time.Second), st.answered.Add(stopClose))
		if strict {
			r.Strict++
		}
		bound := lease + 5*time.Second
		if strict {
			bound = stopClose
		}
		turns := map[string]bool{}
		for _, q := range reqs {
			if q.conversation != key || !q.openAt(st.answered) {
				continue
			}
			r.Open++
			turns[q.turn] = true
			switch {
			case q.end == endOpen:
				stopped.add("%s was still open at the end of the run, after a stop answered at %s", describe(q), st.answered.Format("15:04:05.000"))
			case q.ended.Sub(st.answered) > bound:
				stopped.add("%s was open %s after a stop answered at %s (%s)", describe(q), q.ended.Sub(st.answered).Round(time.Millisecond), st.answered.Format("15:04:05.000"), q.end)
			case strict && q.end == endAnswered && q.ended.Sub(st.answered) > stopGrace:
				stopped.add("%s went on to the agent's end %s after a stop answered at %s: the worker never closed it", describe(q), q.ended.Sub(st.answered).Round(time.Millisecond), st.answered.Format("15:04:05.000"))
			default:
				r.Longest = max(r.Longest, q.ended.Sub(st.answered))
			}
		}
		for _, q := range reqs {
			if q.conversation == key && turns[q.turn] && q.arrived.After(st.answered) && (strict || q.arrived.Sub(st.answered) > bound) {
				stopped.add("%s was posted after a stop of its turn answered at %s", describe(q), st.answered.Format("15:04:05.000"))
			}
		}
	}

	for _, e := range errs {
		r.Errors++
		for _, t := range agentErrorTexts {
			if strings.HasPrefix(e.content, t) {
				r.AgentErrors++
				break
			}
		}
		for _, f := range faults {
			if f.kind == FaultAgentDown && !e.created.Before(f.at) && !f.healed.IsZero() && !e.created.After(f.healed) {
				r.DownErrors++
				break
			}
		}
		bad := !cleanError.MatchString(e.content)
		for _, w := range uncleanWords {
			bad = bad || strings.Contains(e.content, w)
		}
		if bad {
			unclean.add("error %s of conversation %s reads %q", e.id, e.conversation, e.content)
		}
	}
	return []*Check{runIDs, answered, unclean, stopped}, r
}

// faultAbout reports whether a fault acted at some moment between from
// and to.
func faultAbout(faults []faultRecord, from, to time.Time) bool {
	for _, f := range faults {
		end := f.began.Add(f.took)
		if !f.healed.IsZero() && f.healed.After(end) {
			end = f.healed
		}
		if f.began.Before(to) && end.Add(2*time.Second).After(from) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
