package chaos

import (
	"context"
	"fmt"
	"time"
)

// Faults of a run with external agents (Config.Agents): the agent's
// process killed, for a moment or for longer than the workers retry; a
// worker killed while the recorder holds its step; and the network
// between the workers and an agent cut or spoiled.
const (
	// FaultAgentKill SIGKILLs an agent process and starts it again after
	// 0.1–2 s: the workers' steps in flight break off and are posted
	// again, with the same run id.
	FaultAgentKill FaultKind = "agent_kill"
	// FaultAgentDown SIGKILLs an agent process and keeps it down for
	// longer than a turn retries (agentDownFor): the turns that meet it
	// end with a visible error, which must be clean.
	FaultAgentDown FaultKind = "agent_down"
	// FaultAgentStepKill makes the recorder hold the next request of a
	// step after the first (the turn's first step, with its tool call,
	// is journaled) until the worker that sent it is SIGKILLed: the next
	// claim of the turn goes on from the journal and posts the same
	// step, with the same run id, and never the first again.
	FaultAgentStepKill FaultKind = "agent_step_kill"
	// FaultWorkerCutAgent cuts the worker with the most steps in flight
	// from its agent (the recorder's port) for 6–9 s, longer than it
	// waits for a first byte or an event.
	FaultWorkerCutAgent FaultKind = "worker_cut_agent"
	// FaultAgentLinkDelay holds every packet of an agent's link 200 ms
	// each way and drops 5% both ways, for 8–12 s.
	FaultAgentLinkDelay FaultKind = "agent_link_delay"
	// FaultAgentCut takes an agent's link down for 3–6 s: its requests
	// in flight go silent.
	FaultAgentCut FaultKind = "agent_cut"
)

// AgentFaults are the kinds a run with agents adds to the schedule.
var AgentFaults = []FaultKind{
	FaultAgentKill, FaultAgentDown, FaultAgentStepKill,
	FaultWorkerCutAgent, FaultAgentLinkDelay, FaultAgentCut,
}

// AgentNetworkFaults are the agent kinds that cut or spoil links.
var AgentNetworkFaults = []FaultKind{FaultWorkerCutAgent, FaultAgentLinkDelay, FaultAgentCut}

// agentFaultWeights say how often each agent kind fills the schedule
// beyond one of each.
var agentFaultWeights = map[FaultKind]int{
	FaultAgentKill:      3,
	FaultAgentDown:      1,
	FaultAgentStepKill:  3,
	FaultWorkerCutAgent: 2,
	FaultAgentLinkDelay: 1,
	FaultAgentCut:       1,
}

// agentDownFor is how long agent_down keeps an agent down, at least:
// longer than a turn retries its step (three attempts, each with three
// retries inside it, about 12 s in all).
const agentDownFor = 15 * time.Second

// kinds are the fault kinds a run's schedule covers.
func (c Config) kinds() []FaultKind {
	if len(c.Agents) == 0 {
		return AllFaults
	}
	return append(append([]FaultKind(nil), AllFaults...), AgentFaults...)
}

// weightOf is how often kind fills the schedule beyond one of each.
func weightOf(kind FaultKind) int {
	if w, ok := agentFaultWeights[kind]; ok {
		return w
	}
	return faultWeights[kind]
}

// agentFault kills an agent, or a worker while its step is held.
func (in *injector) agentFault(ctx context.Context, r *faultRecord) {
	s := in.sys
	if r.kind == FaultAgentStepKill {
		in.agentStepKill(ctx, r)
		return
	}
	a := s.agents[in.rng.IntN(len(s.agents))]
	r.target = a.name
	a.take()
	a.kill()
	r.at = time.Now()
	down := in.restartDelay()
	r.note = "SIGKILL of the " + a.kind.name + " agent"
	if r.kind == FaultAgentDown {
		down = agentDownFor + time.Duration(in.rng.IntN(3000))*time.Millisecond
		r.note += fmt.Sprintf(", kept down %s (past the workers' retries)", down.Round(time.Millisecond))
	}
	in.sleep(ctx, down)
	in.restart(a.process, r)
	if err := a.waitReady(`"message":"listening"`, 30*time.Second); err != nil {
		r.failed = true
		r.note += "; NOT BACK: " + firstLine(err.Error())
		return
	}
	r.healed = time.Now()
	r.note += ", then started again"
}

// agentStepKill holds the next request of a step after the first that
// any recorder receives until the worker that sent it is SIGKILLed, then
// lets it go (it never reaches the agent) and starts the worker again.
func (in *injector) agentStepKill(ctx context.Context, r *faultRecord) {
	s := in.sys
	arrived := make(chan *stepRequest, len(s.agents))
	var releases []func()
	for _, a := range s.agents {
		ch, release := a.rec.arm(1)
		releases = append(releases, release)
		go func() {
			select {
			case sr := <-ch:
				arrived <- sr
			case <-ctx.Done():
			}
		}()
	}
	releaseAll := func() {
		for _, release := range releases {
			release()
		}
	}
	defer releaseAll()
	var sr *stepRequest
	select {
	case sr = <-arrived:
	case <-time.After(mcpCallWait):
	case <-ctx.Done():
	}
	r.at = time.Now()
	if sr == nil {
		r.target = "agents"
		r.failed = true
		r.note = fmt.Sprintf("no step request arrived within %s: nothing to act on", mcpCallWait)
		return
	}
	r.target = sr.worker
	var w *process
	for _, p := range s.workers {
		if p.name == sr.worker {
			w = p
		}
	}
	if w == nil {
		r.failed = true
		r.note = fmt.Sprintf("a step request came from %s, which is no worker", sr.worker)
		return
	}
	w.take()
	w.kill()
	r.at = time.Now()
	// Its other arms too: only this request is held.
	releaseAll()
	r.runID = sr.runID
	r.note = fmt.Sprintf("SIGKILL while the recorder held its request of step %d (run id %s) to %s", sr.step, sr.runID, sr.agent)
	in.sleep(ctx, in.restartDelay())
	in.restart(w, r)
}

// busiestAgentWorker is the worker with the most step requests open now,
// or the first.
func (s *system) busiestAgentWorker() *process {
	open := map[string]int{}
	for _, a := range s.agents {
		for w, n := range a.rec.open() {
			open[w] += n
		}
	}
	best := s.workers[0]
	for _, w := range s.workers {
		if open[w.name] > open[best.name] {
			best = w
		}
	}
	return best
}
