package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// The benchmarks run real baton processes (relay, API, worker) against a
// durable PostgreSQL cluster and an embedded NATS server, and only with
// -bench (`make bench` runs them all and prints one table):
//
//	go test -run '^$' -bench 'BenchmarkDebounce|BenchmarkTurns' -benchtime 1x ./consumer/

// modelCalls is a model server's record of when each request arrived, by
// the content of its newest user message.
type modelCalls struct {
	mu      sync.Mutex
	at      map[string][]time.Time
	waiters map[string]chan time.Time
}

func newModelCalls() *modelCalls {
	return &modelCalls{at: map[string][]time.Time{}, waiters: map[string]chan time.Time{}}
}

func (c *modelCalls) respond(req bench.ModelRequest) bench.ModelReply {
	key := req.LastUser()
	c.mu.Lock()
	c.at[key] = append(c.at[key], req.At)
	w := c.waiters[key]
	delete(c.waiters, key)
	c.mu.Unlock()
	if w != nil {
		w <- req.At
	}
	return bench.ModelReply{Chunks: []string{"ok"}}
}

// expect returns a channel that receives when the first model call whose
// newest user message is key arrives.
func (c *modelCalls) expect(key string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiters[key] = ch
	return ch
}

// withPrefix counts the model calls whose newest user message starts with
// prefix.
func (c *modelCalls) withPrefix(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, ats := range c.at {
		if strings.HasPrefix(k, prefix) {
			n += len(ats)
		}
	}
	return n
}

const (
	loneSamples = 300
	bursts      = 100
)

// BenchmarkDebounce measures, for a lone message, the time from the
// client's POST to the start of the model call (the model server
// receiving the request), with the default settings (a quiet window of
// --debounce 100ms before a reply) against the same system with the
// debounce off: two stacks of real processes (relay, API, worker with an
// OpenAI-compatible agent) over one PostgreSQL, one message at a time,
// alternating between them. Then 100 bursts of three messages 10 ms
// apart on the default stack: each must get one reply covering all
// three; the superseded runs are the extra model calls.
func BenchmarkDebounce(b *testing.B) {
	for range b.N {
		debounceOnce(b)
	}
}

func debounceOnce(b *testing.B) {
	ctx := context.Background()
	bin := bench.Binary(b)
	pg := bench.StartPostgres(b, nil)
	calls := newModelCalls()
	model := bench.NewModel(b, calls.respond)
	agentArgs := []string{"--agent", "openai", "--model-base-url", model.BaseURL(), "--model", "bench"}
	apiArgs := []string{"--messages-per-minute", "1000000", "--message-burst", "100000", "--max-conversations=-1"}
	stacks := map[string]*bench.Stack{
		"default": bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: testenv.StartNATS(b).URL, APIArgs: apiArgs, WorkerArgs: agentArgs}),
		"off": bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: testenv.StartNATS(b).URL, APIArgs: apiArgs,
			WorkerArgs: append(append([]string{}, agentArgs...), "--debounce", "0")}),
	}
	for name, s := range stacks {
		for i := range loneSamples + 20 {
			s.CreateConversation(b, fmt.Sprintf("lone-%d", i))
		}
		if name == "default" {
			for i := range bursts {
				s.CreateConversation(b, fmt.Sprintf("burst-%d", i))
			}
		}
	}

	// One lone message: post, wait for its model call, then for its turn
	// to end, so that every message finds the system idle.
	lone := func(name string, i int) time.Duration {
		s := stacks[name]
		key := fmt.Sprintf("lone %s %d", name, i)
		called := calls.expect(key)
		start := time.Now()
		if err := s.Post(ctx, fmt.Sprintf("lone-%d", i), fmt.Sprintf("lone-%d", i), key); err != nil {
			b.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-called:
		case <-time.After(30 * time.Second):
			b.Fatalf("%s: no model call for a lone message within 30s", name)
		}
		s.DB.WaitCount(b, 0, 30*time.Second, 2*time.Millisecond, `SELECT count(*) FROM agent_outbox WHERE status <> 'done'`)
		return at.Sub(start)
	}
	// Warm up: connections, prepared statements, the pull consumer.
	for i := range 20 {
		lone("default", loneSamples+i)
		lone("off", loneSamples+i)
	}
	b.ResetTimer()
	latency := map[string][]time.Duration{}
	for i := range loneSamples {
		order := []string{"default", "off"}
		if i%2 == 1 {
			order = []string{"off", "default"}
		}
		for _, name := range order {
			latency[name] = append(latency[name], lone(name, i))
		}
	}

	// Bursts on the default stack.
	s := stacks["default"]
	covered, superseded := 0, int64(0)
	for i := range bursts {
		conv := fmt.Sprintf("burst-%d", i)
		start := time.Now()
		for k := range 3 {
			time.Sleep(time.Until(start.Add(time.Duration(k) * 10 * time.Millisecond)))
			if err := s.Post(ctx, conv, fmt.Sprintf("%s-m%d", conv, k), fmt.Sprintf("burst %d m%d", i, k)); err != nil {
				b.Fatal(err)
			}
		}
		const pending = `SELECT count(*) FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id
			WHERE c.public_id = $1 AND o.status <> 'done'`
		s.DB.WaitCount(b, 0, 30*time.Second, 5*time.Millisecond, pending, conv)
		replies := s.DB.Count(b, `SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id
			WHERE c.public_id = $1 AND m.role = 'assistant'`, conv)
		coveringAll := s.DB.Count(b, `SELECT count(*) FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id
			WHERE c.public_id = $1 AND r.status = 'finalized' AND cardinality(r.outbox_ids) = 3`, conv)
		if replies == 1 && coveringAll == 1 {
			covered++
		} else {
			// The messages' commits, and the runs: what the window saw.
			var commits, runs string
			_ = s.DB.Pool.QueryRow(ctx, `SELECT string_agg(to_char(m.created_at, 'HH24:MI:SS.MS'), ' ' ORDER BY m.seq)
				FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id = $1 AND m.role = 'user'`, conv).Scan(&commits)
			_ = s.DB.Pool.QueryRow(ctx, `SELECT string_agg(r.status || ' ' || r.outbox_ids::text || ' ' || to_char(r.started_at, 'HH24:MI:SS.MS')
				|| '-' || coalesce(to_char(r.finished_at, 'HH24:MI:SS.MS'), '?'), '; ' ORDER BY r.started_at)
				FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.public_id = $1`, conv).Scan(&runs)
			b.Errorf("burst %d: %d replies, %d covering all three messages; want one reply covering all three (messages stored at %s; runs %s)",
				i, replies, coveringAll, commits, runs)
		}
		superseded += s.DB.Count(b, `SELECT count(*) FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id
			WHERE c.public_id = $1 AND r.status = 'superseded'`, conv)
	}
	b.StopTimer()
	extraCalls := calls.withPrefix("burst ") - bursts

	p50, p50Ref := bench.Percentile(latency["default"], 50), bench.Percentile(latency["off"], 50)
	p99, p99Ref := bench.Percentile(latency["default"], 99), bench.Percentile(latency["off"], 99)
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(superseded)/bursts, "superseded/burst")
	bench.Record(b, bench.Figure{ID: "1a", Name: fmt.Sprintf("lone message, POST to model-call start, p50, default settings (%d messages)", loneSamples),
		Value: bench.Ms(p50), Reference: bench.Ms(p50Ref) + " with --debounce 0", Ratio: float64(p50) / float64(p50Ref)})
	bench.Record(b, bench.Figure{ID: "1b", Name: "lone message, POST to model-call start, p99, default settings",
		Value: bench.Ms(p99), Reference: bench.Ms(p99Ref) + " with --debounce 0", Ratio: float64(p99) / float64(p99Ref),
		Aim: "within 5 ms of the reference", Met: bench.Verdict(p99 <= p99Ref+5*time.Millisecond)})
	bench.Record(b, bench.Figure{ID: "1c", Name: "bursts of three messages 10 ms apart answered by one reply covering all three",
		Value: fmt.Sprintf("%d of %d", covered, bursts), Aim: fmt.Sprintf("%d of %d", bursts, bursts), Met: bench.Verdict(covered == bursts)})
	bench.Record(b, bench.Figure{ID: "1d", Name: "extra model calls per burst (superseded runs per burst)",
		Value: fmt.Sprintf("%.2f (%.2f)", float64(extraCalls)/bursts, float64(superseded)/bursts)})
}

// referenceCommit is the commit before the one-statement claim and
// finalize and the quiet window after the claim: the reference binary of
// BenchmarkTurns.
const referenceCommit = "e06d89e"

// BenchmarkTurns measures turns per second of one `baton worker` process
// with the echo agent and default settings, 5,000 conversations each with
// one message ready at once (committed, and published by the relay,
// before the worker starts), from the worker's start to its last reply's
// commit; against the binary of referenceCommit, built in the same run
// from a git worktree, run the same way. Each binary runs twice,
// alternating, and the faster run counts. Then both run again with the
// worker's database URL asking for 16 connections (pgxpool's default is
// max(4, CPUs)) and generic plans (tunedURLParams), which shows what
// limits the default figure; and each runs 1,000 turns with its worker
// connected through a Wire, which counts the statements, round trips and
// transactions per turn.
func BenchmarkTurns(b *testing.B) {
	for range b.N {
		turnsOnce(b)
	}
}

const throughputConversations = 5000

// tunedURLParams are database URL settings of the worker: pgx's pool size,
// and PostgreSQL's plan cache mode.
var tunedURLParams = []string{"pool_max_conns=16", "plan_cache_mode=force_generic_plan"}

func turnsOnce(b *testing.B) {
	old := bench.BinaryAt(b, referenceCommit)
	cur := bench.Binary(b)
	pg := bench.StartPostgres(b, nil)
	b.ResetTimer()
	rate := map[string]float64{}
	tuned := map[string]float64{}
	for _, bin := range []string{old, cur, cur, old} {
		r := turnsRun(b, pg, bin, throughputConversations, false)
		rate[bin] = max(rate[bin], r.rate)
	}
	for _, bin := range []string{cur, old, old, cur} {
		r := turnsRun(b, pg, bin, throughputConversations, false, tunedURLParams...)
		tuned[bin] = max(tuned[bin], r.rate)
	}
	counts := map[string]bench.WireCounts{}
	turns := map[string]float64{}
	for _, bin := range []string{old, cur} {
		r := turnsRun(b, pg, bin, 1000, true)
		counts[bin], turns[bin] = r.counts, float64(r.turns)
	}
	b.StopTimer()
	b.ReportMetric(rate[cur], "turns/s")
	b.ReportMetric(rate[old], "reference_turns/s")
	per := func(bin string, n int64) float64 { return float64(n) / turns[bin] }
	bench.Record(b, bench.Figure{ID: "2a", Name: "turns/s, one worker, echo agent, default settings, 5,000 conversations ready at once (best of 2 runs)",
		Value: bench.Thousands(rate[cur]) + " turns/s", Reference: bench.Thousands(rate[old]) + " turns/s, binary of " + referenceCommit,
		Ratio: rate[cur] / rate[old], Aim: "3x or more", Met: bench.Verdict(rate[cur] >= 3*rate[old])})
	for _, f := range []struct {
		id, what string
		n        func(bench.WireCounts) int64
	}{
		{"2b", "statements per turn (without BEGIN/COMMIT)", func(c bench.WireCounts) int64 { return c.Statements }},
		{"2c", "round trips per turn (BEGIN, COMMIT and statement preparation included)", func(c bench.WireCounts) int64 { return c.RoundTrips }},
		{"2d", "transactions per turn", func(c bench.WireCounts) int64 { return c.Transactions }},
	} {
		bench.Record(b, bench.Figure{ID: f.id, Name: f.what + ", counted on the wire over 1,000 turns",
			Value: fmt.Sprintf("%.2f", per(cur, f.n(counts[cur]))), Reference: fmt.Sprintf("%.2f, binary of %s", per(old, f.n(counts[old])), referenceCommit),
			Ratio: per(cur, f.n(counts[cur])) / per(old, f.n(counts[old]))})
	}
	bench.Record(b, bench.Figure{ID: "2e", Name: "turns/s as 2a, the worker's database URL with " + strings.Join(tunedURLParams, "&") + " (both binaries)",
		Value: bench.Thousands(tuned[cur]) + " turns/s", Reference: bench.Thousands(tuned[old]) + " turns/s, binary of " + referenceCommit,
		Ratio: tuned[cur] / tuned[old]})
}

type turnsResult struct {
	turns  int64
	rate   float64
	counts bench.WireCounts
}

// turnsRun runs one worker of bin over conversations conversations with one
// pending message each, committed and published before it starts.
func turnsRun(b *testing.B, pg *bench.Postgres, bin string, conversations int, wire bool, workerURLParams ...string) turnsResult {
	ctx := context.Background()
	ns := testenv.StartNATS(b)
	s := bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: ns.URL, NoWorker: true})
	defer s.Stop()
	// Plain SQL that both schemas take, in one transaction: every
	// message is ready at once.
	_, err := s.DB.Pool.Exec(ctx, `
		WITH c AS (
			INSERT INTO conversations (id, public_id, owner_id)
			SELECT 'c_bench_' || g, 'bench-' || g, $1 FROM generate_series(1, $2) g RETURNING id),
		m AS (
			INSERT INTO messages (id, public_id, owner_id, conversation_id, role, content)
			SELECT 'm_bench_' || substr(c.id, 9), 'm' || substr(c.id, 9), $1, c.id, 'user', 'hello' FROM c RETURNING id, conversation_id)
		INSERT INTO agent_outbox (conversation_id, message_id) SELECT conversation_id, id FROM m`, s.UserID, conversations)
	if err != nil {
		b.Fatal(err)
	}
	_, js := ns.Connect(b)
	waitStreamMsgs(b, js, uint64(conversations))

	dbURL := ""
	var w *bench.Wire
	if wire {
		w = bench.NewWire(b, bench.HostPort(s.DB.URL))
		dbURL = bench.WithHostPort(s.DB.URL, w.Addr())
	}
	pgBefore := s.DB.BackendCPU(b)
	selfBefore, _ := bench.CPU(0)
	if dbURL == "" {
		dbURL = s.DB.URL
	}
	s.Worker = s.StartWorker(b, bench.WithParams(dbURL, workerURLParams...))
	s.DB.WaitCount(b, 0, 10*time.Minute, 50*time.Millisecond, `SELECT count(*) FROM agent_outbox WHERE status <> 'done'`)
	pgCPU := bench.CPUSince(s.DB.BackendCPU(b), pgBefore)
	selfCPU, _ := bench.CPU(0)
	selfCPU -= selfBefore
	var r turnsResult
	if w != nil {
		r.counts = w.Counts()
	}
	var last time.Time
	if err := s.DB.Pool.QueryRow(ctx, `SELECT count(*), max(finished_at) FROM agent_runs WHERE status = 'finalized'`).Scan(&r.turns, &last); err != nil {
		b.Fatal(err)
	}
	elapsed := last.Sub(s.Worker.Started)
	r.rate = float64(r.turns) / elapsed.Seconds()
	cpu, _ := s.Worker.CPU()
	perTurn := func(d time.Duration) time.Duration { return d / time.Duration(r.turns) }
	b.Logf("%s: %d turns of %d conversations in %s from the worker's start: %.0f turns/s; processor time per turn: worker %s, PostgreSQL %s, benchmark process with NATS %s",
		bin, r.turns, conversations, elapsed.Round(time.Millisecond), r.rate, perTurn(cpu), perTurn(pgCPU), perTurn(selfCPU))
	if w != nil {
		b.Logf("%s: on the wire: %+v", bin, r.counts)
	}
	return r
}

// waitStreamMsgs waits until the outbox stream holds n messages.
func waitStreamMsgs(b *testing.B, js jetstream.JetStream, n uint64) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := js.Stream(ctx, batonnats.DefaultStream)
		if err == nil && st.CachedInfo().State.Msgs >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the outbox stream did not reach %d messages within 5 minutes (%v)", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
