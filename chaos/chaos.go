package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"
)

// Result is a finished run.
type Result struct {
	Config  Config
	Verdict *Verdict
	Faults  []faultRecord
	// Unexpected are exits of processes that the harness did not cause.
	Unexpected map[string]int64
	// Sent, Accepted, Rejected and Retried count the client's messages;
	// Retried were posted more than once.
	Sent, Accepted, Rejected, Retried int
	Conversations, Deleted            int
	Load, Settle, Total               time.Duration
	// Settled is false when rows were still moving at SettleTimeout.
	Settled bool
	// Status is what `baton status` said of the system after the run.
	Status string
	// Triggers compares the triggers left in the stream with the database.
	Triggers TriggerAudit
	// AnswersRetried counts, by HTTP status, the API's answers after which
	// the client sent the request again (5xx and 429; 0 is no answer):
	// 503 while the database is away, never 500.
	AnswersRetried map[int]int
	// Streams says what the live event streams saw.
	Streams streamsReport
	// MCP says what the MCP server received and what became of the
	// approvals.
	MCP mcpReport
	// Agents says what the external agents' recorders received, what
	// became of the stops and what the visible errors were, in a run
	// with agents.
	Agents agentReport
	// Dir holds the logs of every process; kept when the run failed.
	Dir string
}

// Passed reports whether every invariant held.
func (r *Result) Passed() bool { return r.Verdict != nil && r.Verdict.Passed() }

// Run starts the system, drives the load through the faults, waits for the
// system to settle and judges it. An error means the harness itself could
// not run; a failed invariant is a Result that did not pass.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	out := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format, args...) }
	out("chaos: seed %d (replay with --seed %d)\n", cfg.Seed, cfg.Seed)

	dir := cfg.Dir
	keep := dir != ""
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "baton-chaos-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res := &Result{Config: cfg, Dir: dir}

	out("chaos: starting PostgreSQL and its synchronous standby, %d NATS nodes, %d relays, %d workers and the API in %s\n", natsCount, relayCount, workerCount, dir)
	if len(cfg.Agents) > 0 {
		out("chaos: the workers post their steps to external agents: %s\n", strings.Join(cfg.Agents, ", "))
	}
	sys, err := startSystem(ctx, cfg, dir)
	if sys != nil {
		defer func() {
			sys.stop()
			if !keep && res.Passed() {
				_ = os.RemoveAll(dir)
			}
		}()
	}
	if err != nil {
		return nil, fmt.Errorf("start the system (logs in %s): %w", dir, err)
	}

	loadRNG := rand.New(rand.NewPCG(uint64(cfg.Seed), 1))
	faultRNG := rand.New(rand.NewPCG(uint64(cfg.Seed), 2))
	plan := planLoad(cfg, loadRNG)
	faults := planFaults(cfg, faultRNG)
	cl := newClient(sys.apiURL, sys.token)
	if err := createConversations(ctx, cl, plan.conversations, cfg.Clients); err != nil {
		return nil, err
	}
	// Live event streams stay open through the load, the faults and the
	// settling, as browser tabs would.
	streamCtx, stopStreams := context.WithCancel(ctx)
	streams, streamsDone := openStreams(streamCtx, sys.apiURL, sys.token, streamedConversations(plan.conversations))
	stop := func() {
		stopStreams()
		streamsDone.Wait()
	}
	defer stop()
	out("chaos: %d messages over %d conversations and %s, %d faults, %d live event streams\n", len(plan.messages), len(plan.conversations), cfg.LoadDuration, len(faults), len(streams))

	inj := &injector{sys: sys, rng: faultRNG, out: out}
	start := time.Now()
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		inj.run(ctx, faults, start)
		// A little more traffic after the last fault, so that it too is
		// followed by turns.
		inj.sleep(ctx, 2*time.Second)
	}()
	cl.drive(ctx, plan, cfg.Clients, faultsDone)
	res.Load = time.Since(start)
	out("chaos: load and faults over after %s\n", res.Load.Round(time.Millisecond))
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	settleStart := time.Now()
	res.Settled = settle(ctx, sys, cfg.SettleTimeout)
	res.Settle = time.Since(settleStart)
	out("chaos: settled=%v after %s; judging\n", res.Settled, res.Settle.Round(time.Millisecond))

	res.Faults = inj.injected()
	for i, f := range res.Faults {
		if f.healed.IsZero() {
			continue
		}
		var next *time.Time
		if err := sys.pool.QueryRow(ctx, `SELECT min(finished_at) FROM agent_runs WHERE status = 'finalized' AND finished_at > $1`, f.healed).Scan(&next); err == nil && next != nil {
			res.Faults[i].healToTurn = next.Sub(f.healed)
		}
	}
	res.Unexpected = sys.unexpectedExits()
	tally, decided := cl.endApprovals()
	v, err := judge(ctx, sys.pool, plan, cl, res.Faults)
	if err != nil {
		return nil, fmt.Errorf("judge: %w", err)
	}
	res.Verdict = v
	ops, approvals, err := loadMCP(ctx, sys.pool)
	if err != nil {
		return nil, fmt.Errorf("judge the MCP calls: %w", err)
	}
	mcpChecks, mcp := judgeMCP(sys.mcp.received(), ops, approvals, decided, res.Faults)
	mcp.Load = tally
	res.MCP = mcp
	v.Checks = append(v.Checks, mcpChecks...)
	if len(cfg.Agents) > 0 {
		errs, keys, err := loadAgentFacts(ctx, sys.pool)
		if err != nil {
			return nil, fmt.Errorf("judge the agents' steps: %w", err)
		}
		agentChecks, agents := judgeAgents(sys.agentRequests(), cl.stopsAsked(), keys, errs, res.Faults, cfg.Lease)
		res.Agents = agents
		v.Checks = append(v.Checks, agentChecks...)
	}
	// An operator's view after the run, on the same multi-host URL: the
	// primary of the last failover, the relay's slot there, the standby
	// synchronous, nothing that needs attention.
	status := &Check{Name: CheckStatus}
	said, problem := sys.checkStatus(ctx, 30*time.Second)
	if problem != "" {
		status.add("baton status after the run: %s (%s)", problem, said)
	}
	res.Status = said
	res.Triggers = sys.auditTriggers(ctx, sys.pool)
	v.Checks = append(v.Checks, status)
	var live *Check
	res.Streams, live = judgeStreams(ctx, sys.pool, sys.natsURL, streams, stop, 60*time.Second)
	v.Checks = append(v.Checks, live)
	failed := &Check{Name: CheckFaultNotCarried}
	for _, f := range res.Faults {
		if f.failed {
			failed.add("%s of %s at %s: %s", f.kind, f.target, f.at.Format(time.TimeOnly), f.note)
		}
	}
	v.Checks = append(v.Checks, failed)
	// A fast shutdown of PostgreSQL that waits on a walsender forever is a
	// relay that never confirms the end of WAL: a failure, not a figure.
	hung := &Check{Name: CheckHungShutdown}
	for _, f := range res.Faults {
		if f.hung {
			hung.add("%s at %s: %s", f.kind, f.at.Format(time.TimeOnly), f.note)
		}
	}
	v.Checks = append(v.Checks, hung)
	for _, m := range plan.messages {
		m.mu.Lock()
		if m.posts > 0 {
			res.Sent++
		}
		if m.accepted {
			res.Accepted++
		} else if m.posts > 0 {
			res.Rejected++
		}
		if m.posts > 1 {
			res.Retried++
		}
		m.mu.Unlock()
	}
	res.Conversations = len(plan.conversations)
	res.Deleted = len(cl.deletedConversations())
	res.AnswersRetried = cl.retriedAnswers()
	res.Total = time.Since(began)
	return res, nil
}

func createConversations(ctx context.Context, cl *client, ids []string, clients int) error {
	work := make(chan string)
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	for range min(clients, 16) {
		wg.Go(func() {
			for id := range work {
				if err := cl.createConversation(ctx, id); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// settle waits until every process runs and no outbox row or run is in
// flight, polling the database, for at most within.
func settle(ctx context.Context, sys *system, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if sys.allRunning() {
			var open int
			err := sys.pool.QueryRow(ctx, `
				SELECT (SELECT count(*) FROM agent_outbox WHERE status NOT IN ('done', 'error'))
					+ (SELECT count(*) FROM agent_runs WHERE status = 'running')`).Scan(&open)
			if err == nil && open == 0 {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}
