package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/pgcluster"
)

// FaultKind is one way the harness hurts the system.
type FaultKind string

// Fault kinds. The worker crash kinds restart a worker with BATON_CRASH_AT
// armed at one point, so that it kills itself there; the others are
// SIGKILLs and restarts from outside. The Postgres kinds hit the primary,
// except the pause, which stops the synchronous standby's WAL receiver; a
// failover leaves a new primary and a new standby for the next ones.
const (
	FaultWorkerKill               FaultKind = "worker_kill"
	FaultCrashBeforeClaim         FaultKind = "worker_crash_" + consumer.CrashBeforeClaim
	FaultCrashAfterClaim          FaultKind = "worker_crash_" + consumer.CrashAfterClaim
	FaultCrashDuringModel         FaultKind = "worker_crash_" + consumer.CrashDuringModel
	FaultCrashAfterTool           FaultKind = "worker_crash_" + consumer.CrashAfterTool
	FaultCrashBeforeFinalize      FaultKind = "worker_crash_" + consumer.CrashBeforeFinalize
	FaultCrashAfterFinalizeBefore FaultKind = "worker_crash_" + consumer.CrashAfterFinalizeBeforeAck
	FaultRelayKill                FaultKind = "relay_kill"
	FaultNATSNodeKill             FaultKind = "nats_node_kill"
	FaultPostgresFast             FaultKind = "postgres_restart_fast"
	FaultPostgresImmediate        FaultKind = "postgres_restart_immediate"
	FaultPostgresFailover         FaultKind = "postgres_failover"
	FaultPostgresFailoverBehind   FaultKind = "postgres_failover_behind"
	FaultStandbyPause             FaultKind = "postgres_standby_pause"
	FaultStreamWipe               FaultKind = "stream_wipe"

	// Network faults: a process's link is cut, in part or whole, or drops
	// packets, for a while, and then healed; the processes stay alive.
	FaultNATSPartition     FaultKind = "nats_partition"
	FaultNATSLeaderCut     FaultKind = "nats_leader_cut"
	FaultRelayCutNATS      FaultKind = "relay_cut_nats"
	FaultRelayCutPostgres  FaultKind = "relay_cut_postgres"
	FaultWorkerCutPostgres FaultKind = "worker_cut_postgres"
	FaultAPICutNATS        FaultKind = "api_cut_nats"
	FaultLinkDelay         FaultKind = "link_delay"
	FaultOneWayLoss        FaultKind = "oneway_loss"
)

// MCP faults act on the next call the run's MCP server receives: it holds
// the call while the worker that sent it is SIGKILLed, or it drops the
// call's connection without an answer. Either way the call arrived, and
// its outcome is unknown to the worker.
const (
	FaultMCPCallKill FaultKind = "mcp_call_kill"
	FaultMCPCallDrop FaultKind = "mcp_call_drop"
)

// AllFaults lists every kind, in the order of the summary.
var AllFaults = []FaultKind{
	FaultWorkerKill,
	FaultCrashBeforeClaim, FaultCrashAfterClaim, FaultCrashDuringModel,
	FaultCrashAfterTool, FaultCrashBeforeFinalize, FaultCrashAfterFinalizeBefore,
	FaultMCPCallKill, FaultMCPCallDrop,
	FaultRelayKill, FaultNATSNodeKill,
	FaultPostgresFast, FaultPostgresImmediate,
	FaultPostgresFailover, FaultStandbyPause,
	FaultStreamWipe,
	FaultNATSPartition, FaultNATSLeaderCut, FaultRelayCutNATS, FaultRelayCutPostgres,
	FaultWorkerCutPostgres, FaultAPICutNATS, FaultLinkDelay, FaultOneWayLoss,
}

// NetworkFaults are the kinds that cut or spoil links rather than kill
// processes.
var NetworkFaults = []FaultKind{
	FaultNATSPartition, FaultNATSLeaderCut, FaultRelayCutNATS, FaultRelayCutPostgres,
	FaultWorkerCutPostgres, FaultAPICutNATS, FaultLinkDelay, FaultOneWayLoss,
}

// ExtraFaults run only when a plan names them; no default schedule has
// them.
//
// FaultPostgresFailoverBehind stops the primary's WAL sender to the
// standby for a second or two and then fails over: the commits made
// meanwhile were never acknowledged and die with the primary, but the
// relay may have published them (PostgreSQL 15 decodes a commit for a
// logical slot before the synchronous standby has it), so the stream
// holds triggers of rows that no surviving primary has, and the promoted
// standby may hand their outbox ids out again. Such a trigger once made a
// worker supersede every turn of its conversation during which a copy of
// it arrived; a trigger whose row a claim saw and did not take no longer
// supersedes anything. It stays out of the default schedules (and of the
// short run's, whose summary expects one failover) and runs by --plan.
var ExtraFaults = []FaultKind{FaultPostgresFailoverBehind}

// ParseFault reads a fault kind by its name.
func ParseFault(s string) (FaultKind, error) {
	all := append(append(slices.Clone(AllFaults), ExtraFaults...), AgentFaults...)
	for _, k := range all {
		if string(k) == s {
			return k, nil
		}
	}
	names := make([]string, len(all))
	for i, k := range all {
		names[i] = string(k)
	}
	return "", fmt.Errorf("unknown fault %q: use one of %s", s, strings.Join(names, ", "))
}

// crashPoint is the BATON_CRASH_AT point of a worker crash kind.
func (k FaultKind) crashPoint() (string, bool) {
	p, ok := strings.CutPrefix(string(k), "worker_crash_")
	return p, ok
}

// faultWeights say how often each repeatable kind fills the schedule
// beyond one of each. The stream is wiped once per run, no more.
var faultWeights = map[FaultKind]int{
	FaultWorkerKill:               6,
	FaultCrashBeforeClaim:         2,
	FaultCrashAfterClaim:          2,
	FaultCrashDuringModel:         2,
	FaultCrashAfterTool:           2,
	FaultCrashBeforeFinalize:      2,
	FaultCrashAfterFinalizeBefore: 2,
	FaultMCPCallKill:              3,
	FaultMCPCallDrop:              2,
	FaultRelayKill:                3,
	FaultNATSNodeKill:             4,
	FaultPostgresFast:             1,
	FaultPostgresImmediate:        1,
	FaultPostgresFailover:         1,
	FaultStandbyPause:             2,
	FaultNATSPartition:            1,
	FaultNATSLeaderCut:            1,
	FaultRelayCutNATS:             1,
	FaultRelayCutPostgres:         1,
	FaultWorkerCutPostgres:        2,
	FaultAPICutNATS:               1,
	FaultLinkDelay:                1,
	FaultOneWayLoss:               1,
}

// scheduledFault is a fault and the moment of the load it starts at.
type scheduledFault struct {
	kind FaultKind
	at   time.Duration
}

// planFaults returns the run's faults at random moments of the load: the
// given plan, or one of each kind and random others up to cfg.Faults.
func planFaults(cfg Config, rng *rand.Rand) []scheduledFault {
	kinds := slices.Clone(cfg.Plan)
	if len(kinds) == 0 {
		all := cfg.kinds()
		kinds = slices.Clone(all)
		total := 0
		for _, k := range all {
			total += weightOf(k)
		}
		for len(kinds) < cfg.Faults {
			r := rng.IntN(total)
			for _, k := range all {
				if r < weightOf(k) {
					kinds = append(kinds, k)
					break
				}
				r -= weightOf(k)
			}
		}
		rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	}
	// From two seconds in to 90% of the load, so the last faults still
	// meet traffic.
	lo, hi := 2*time.Second, cfg.LoadDuration*9/10
	ats := make([]time.Duration, len(kinds))
	for i := range ats {
		ats[i] = lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	slices.Sort(ats)
	out := make([]scheduledFault, len(kinds))
	for i := range kinds {
		out[i] = scheduledFault{kind: kinds[i], at: ats[i]}
	}
	return out
}

// faultRecord is what happened when a fault was injected.
type faultRecord struct {
	kind   FaultKind
	target string
	// at is when the process died (or PostgreSQL stopped).
	at   time.Time
	note string
	// hung is set when a PostgreSQL shutdown did not end by itself.
	hung bool
	// failed is set when a Postgres fault could not be carried out as
	// planned (a server that did not start, a promotion or a standby that
	// failed, a pause that held no commit up): the run did not test what
	// it says.
	failed bool
	// took is how long the fault took, restart included.
	took time.Duration
	// healed is when a network fault's link was whole again; zero for
	// the others.
	healed time.Time
	// healToTurn is how long from healed to the next finalized turn.
	healToTurn time.Duration
	// runID is the run id of the step request an agent_step_kill held.
	runID string
	// began is when the injection began; took after it, it was over
	// (a network fault's link healed at healed).
	began time.Time
}

// fastShutdownLimit is how long a fast shutdown of PostgreSQL may take
// before the run calls it hung.
const fastShutdownLimit = 10 * time.Second

// injector runs the fault schedule, one fault at a time.
type injector struct {
	sys *system
	rng *rand.Rand
	out func(format string, args ...any)

	mu      sync.Mutex
	records []faultRecord
}

func (in *injector) record(r faultRecord) {
	in.mu.Lock()
	in.records = append(in.records, r)
	in.mu.Unlock()
	in.out("  fault %-40s %-8s %s\n", r.kind, r.target, firstLine(r.note))
}

// restartDelay is how long a killed process stays dead: random and short.
func (in *injector) restartDelay() time.Duration {
	return time.Duration(100+in.rng.IntN(1900)) * time.Millisecond
}

func (in *injector) run(ctx context.Context, plan []scheduledFault, start time.Time) {
	for _, f := range plan {
		if d := time.Until(start.Add(f.at)); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			return
		}
		began := time.Now()
		r := in.inject(ctx, f.kind)
		r.began, r.took = began, time.Since(began)
		in.record(r)
	}
}

func (in *injector) inject(ctx context.Context, kind FaultKind) faultRecord {
	s := in.sys
	r := faultRecord{kind: kind}
	if point, ok := kind.crashPoint(); ok {
		return in.crashWorker(ctx, r, point)
	}
	switch kind {
	case FaultWorkerKill:
		w := s.workers[in.rng.IntN(len(s.workers))]
		r.target = w.name
		w.take()
		w.kill()
		r.at = time.Now()
		r.note = "SIGKILL at a random moment"
		in.sleep(ctx, in.restartDelay())
		in.restart(w, &r)
	case FaultMCPCallKill, FaultMCPCallDrop:
		in.mcpCall(ctx, &r)
	case FaultRelayKill:
		i, err := s.activeRelay(ctx)
		if err != nil {
			i = in.rng.IntN(len(s.relays))
			r.note = "no active relay found; killed one: "
		}
		p := s.relays[i]
		r.target = p.name
		p.take()
		p.kill()
		r.at = time.Now()
		r.note += "SIGKILL of the active relay"
		in.sleep(ctx, in.restartDelay())
		in.restart(p, &r)
	case FaultNATSNodeKill:
		n := s.nats[in.rng.IntN(len(s.nats))]
		r.target = n.name
		n.take()
		n.kill()
		r.at = time.Now()
		in.sleep(ctx, in.restartDelay())
		in.restart(n.process, &r)
		if state, ok := s.waitStreamHealthy(ctx, 15*time.Second); ok {
			r.note += "SIGKILL and restart; stream replicas current again"
		} else {
			r.note += "SIGKILL and restart; stream replicas not current within 15s: " + state
		}
	case FaultPostgresFast, FaultPostgresImmediate:
		mode, name := pgcluster.Fast, "fast"
		if kind == FaultPostgresImmediate {
			mode, name = pgcluster.Immediate, "immediate"
		}
		s.pgMu.Lock()
		r.target = s.pgName
		stopping := time.Now()
		stopped := make(chan struct{})
		go func() {
			_ = s.pg.Stop(mode)
			close(stopped)
		}()
		r.note = fmt.Sprintf("stopped (%s) and started", name)
		select {
		case <-stopped:
			r.note = fmt.Sprintf("stopped (%s, took %s) and started", name, time.Since(stopping).Round(time.Millisecond))
		case <-time.After(fastShutdownLimit):
			// A fast shutdown waits for every walsender's client to
			// confirm the end of WAL; a relay that does not keeps it
			// waiting for good. Immediate mode ends it, as an operator
			// would, and the run reports it.
			_ = s.pg.Stop(pgcluster.Immediate)
			<-stopped
			r.hung = true
			r.note = fmt.Sprintf("%s shutdown still waiting after %s (walsender waiting for the relay to confirm the end of WAL); stopped in immediate mode and started", name, fastShutdownLimit)
		}
		r.at = time.Now()
		in.sleep(ctx, in.restartDelay())
		err := s.restartPrimary(ctx)
		s.pgMu.Unlock()
		if err != nil {
			r.failed = true
			r.note += "; START FAILED: " + firstLine(err.Error())
		}
	case FaultPostgresFailover, FaultPostgresFailoverBehind:
		in.failover(ctx, &r, kind == FaultPostgresFailoverBehind)
	case FaultStandbyPause:
		in.pauseStandby(ctx, &r)
	case FaultNATSPartition, FaultNATSLeaderCut, FaultRelayCutNATS, FaultRelayCutPostgres,
		FaultWorkerCutPostgres, FaultAPICutNATS, FaultLinkDelay, FaultOneWayLoss,
		FaultWorkerCutAgent, FaultAgentLinkDelay, FaultAgentCut:
		in.network(ctx, &r)
	case FaultAgentKill, FaultAgentDown, FaultAgentStepKill:
		in.agentFault(ctx, &r)
	case FaultStreamWipe:
		r.target = "nats*"
		for _, n := range s.nats {
			n.take()
		}
		var wg sync.WaitGroup
		for _, n := range s.nats {
			wg.Go(n.kill)
		}
		wg.Wait()
		r.at = time.Now()
		for _, n := range s.nats {
			if err := os.RemoveAll(n.store); err != nil {
				r.note += "remove " + n.store + ": " + err.Error() + "; "
			}
		}
		in.sleep(ctx, in.restartDelay())
		for _, n := range s.nats {
			in.restart(n.process, &r)
		}
		if err := s.waitJetStream(ctx, 60*time.Second); err != nil {
			r.note += "JetStream NOT back: " + err.Error()
		} else {
			r.note += "all nodes killed, stores deleted, restarted empty"
		}
	}
	return r
}

// crashWorker restarts a worker with a crash point armed, waits for it to
// die there, and brings it back unarmed.
func (in *injector) crashWorker(ctx context.Context, r faultRecord, point string) faultRecord {
	w := in.sys.workers[in.rng.IntN(len(in.sys.workers))]
	r.target = w.name
	// Points every turn passes die half the time, so the worker dies soon
	// but not always on its first turn; tools are rarer.
	probability := "0.5"
	if point == consumer.CrashAfterTool {
		probability = "1"
	}
	w.take()
	w.kill()
	// A worker that cannot start (PostgreSQL or NATS is down just then)
	// exits at once: arm it again until it dies at the point or 20s pass.
	deadline := time.After(20 * time.Second)
	for r.note == "" {
		if err := w.start(consumer.CrashEnv + "=" + point + ":" + probability); err != nil {
			r.at = time.Now()
			r.note = "could not start armed: " + err.Error()
			break
		}
		select {
		case <-w.exited():
			if err := w.exitStatus(); killedBySignal(err) && w.logged("crash point "+point+" reached") {
				r.at = time.Now()
				r.note = "died at the crash point"
				break
			}
			in.sleep(ctx, 500*time.Millisecond)
		case <-deadline:
			w.kill()
			r.at = time.Now()
			r.note = "crash point not reached within 20s; SIGKILL instead"
		case <-ctx.Done():
			w.kill()
			r.at = time.Now()
			r.note = "run ended before the crash point"
		}
	}
	in.sleep(ctx, in.restartDelay())
	in.restart(w, &r)
	return r
}

// mcpCallWait bounds the wait of an MCP fault for a call to act on.
const mcpCallWait = 30 * time.Second

// mcpCall acts on the next call the MCP server receives: it SIGKILLs the
// worker that sent it while the server holds it (and answers it once the
// worker is dead, into a closed connection), or the server drops the
// call's connection without an answer. The worker's journal has the call
// as started, and its outcome is unknown to it: the turn must fail
// visibly, and the call must never arrive again.
func (in *injector) mcpCall(ctx context.Context, r *faultRecord) {
	s := in.sys
	drop := r.kind == FaultMCPCallDrop
	arrived, release := s.mcp.arm(drop)
	defer release()
	var c *mcpCall
	select {
	case c = <-arrived:
	case <-time.After(mcpCallWait):
	case <-ctx.Done():
	}
	r.at = time.Now()
	if c == nil {
		r.target = "mcp"
		r.failed = true
		r.note = fmt.Sprintf("no MCP call arrived within %s: nothing to act on", mcpCallWait)
		return
	}
	r.target = c.worker
	if drop {
		r.note = fmt.Sprintf("connection of a %s call (key %s) dropped after it arrived", c.tool, c.metaKey)
		return
	}
	var w *process
	for _, p := range s.workers {
		if p.name == c.worker {
			w = p
		}
	}
	if w == nil {
		r.failed = true
		r.note = fmt.Sprintf("a %s call came from %s, which is no worker", c.tool, c.worker)
		return
	}
	w.take()
	w.kill()
	r.at = time.Now()
	release()
	r.note = fmt.Sprintf("SIGKILL while its %s call (key %s) was held by the server", c.tool, c.metaKey)
	in.sleep(ctx, in.restartDelay())
	in.restart(w, r)
}

// restart hands a process back to supervision, which starts it.
func (in *injector) restart(p *process, r *faultRecord) {
	if err := p.supervise(); err != nil {
		r.note += "; restart failed: " + err.Error()
	}
}

func (in *injector) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// records returns the faults injected so far.
func (in *injector) injected() []faultRecord {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.records)
}
