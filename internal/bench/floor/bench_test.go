package floor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/bench/floor"
	"github.com/batonhq/baton/internal/testenv"
)

const (
	loneRounds = 150
	manyChats  = 1000
	manyWaves  = 2
	// A wave's messages are posted over a second, and each answer streams
	// for a second: about every chat of a wave is open at once.
	manySpread = time.Second
	floorAim   = 1.25
)

var (
	loneShape = shape{tokens: 10, every: 15 * time.Millisecond}
	manyShape = shape{tokens: 10, every: 100 * time.Millisecond}
)

func noPrepare(testing.TB, []string) {}

// BenchmarkFloor measures Baton's three paths of a chat against the floor
// chain (package floor: the same hops with none of Baton's logic) in the
// same run, on one durable PostgreSQL, one NATS server and one model
// server, Baton with default settings (and room for 1,000 chats at once):
//
//   - post -> model: the client's POST of a message to the model's
//     request arriving;
//   - model -> commit: the model's answer ending to the client reading the
//     replied event on the conversation's events stream;
//   - token -> chunk: a token leaving the model to the client reading the
//     live delta that carries it;
//
// with one chat at a time (150 chats, alternating between Baton and the
// floor; each answer streams 10 tokens over 150 ms, longer than Baton's
// default quiet window of 100 ms after a message, which holds back a
// reply that comes sooner and which the floor does not have) and with
// 1,000 chats at once (two waves each, alternating; 10 tokens over a
// second). Each chat opens its conversation's events stream before it
// posts. Then the processor time each system's processes (and its
// database's server processes) spent per chat: NATS runs in the
// benchmark's process, and is left out.
//
//	go test -run '^$' -bench BenchmarkFloor -benchtime 1x ./internal/bench/floor/
func BenchmarkFloor(b *testing.B) {
	for range b.N {
		floorOnce(b)
	}
}

func floorOnce(b *testing.B) {
	bin := bench.Binary(b)
	pg := bench.StartPostgres(b, nil)
	ns := testenv.StartNATS(b)
	c := newChats(b)
	s := bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: ns.URL,
		APIArgs: []string{"--messages-per-minute", "1000000", "--message-burst", "100000", "--max-conversations=-1",
			"--max-streams", "20000", "--max-streams-per-user", "20000"},
		WorkerArgs: []string{"--agent", "openai", "--model-base-url", c.model.BaseURL(), "--model", "bench", "--concurrency", "1200"}})
	floorDB := pg.Database(b)
	chain := floor.Start(b, floor.ChainOptions{DatabaseURL: floorDB.URL, NATSURL: ns.URL, ModelURL: c.model.BaseURL()})
	baton := &target{name: "baton", client: s.Client, prepare: func(tb testing.TB, convs []string) {
		for _, id := range convs {
			s.CreateConversation(tb, id)
		}
	}}
	targets := []*target{baton, {name: "floor", client: chain.Client, prepare: noPrepare}}

	// Warm up: connections, prepared statements, the consumers.
	prepare(b, targets, "warm", 20, 0, 0)
	c.lone(b, "warm", targets, 20, loneShape)
	prepare(b, targets, "lone", loneRounds, manyWaves, manyChats)
	stopProfiles := profile(b, s, chain)
	b.ResetTimer()
	batonCPU := newCPUMeter(b, s.DB, s.API, s.Relay, s.Worker)
	floorCPU := newCPUMeter(b, floorDB, chain.API, chain.Relay, chain.Worker)
	lone := c.lone(b, "lone", targets, loneRounds, loneShape)
	batonLone, floorLone := batonCPU.lap(b), floorCPU.lap(b)
	many := c.many(b, targets, manyWaves, manyChats, manySpread, manyShape)
	batonMany, floorMany := batonCPU.lap(b), floorCPU.lap(b)
	b.StopTimer()
	stopProfiles()

	figure := func(id, path string, chats int, pct float64, v, ref []time.Duration) {
		val, r := bench.Percentile(v, pct), bench.Percentile(ref, pct)
		f := bench.Figure{ID: id, Name: fmt.Sprintf("%s, %s, p%.0f (%d samples)", path, chatsText(chats), pct, len(v)),
			Value: bench.Ms(val), Reference: bench.Ms(r) + " floor chain"}
		if r > 0 {
			f.Ratio = float64(val) / float64(r)
			f.Aim, f.Met = fmt.Sprintf("at most %.2fx the floor", floorAim), bench.Verdict(f.Ratio <= floorAim)
		}
		bench.Record(b, f)
	}
	for i, p := range []struct {
		name string
		get  func(*paths) []time.Duration
	}{
		{"post to model request", func(p *paths) []time.Duration { return p.postToModel }},
		{"model answer to replied event read", func(p *paths) []time.Duration { return p.modelToCommit }},
		{"token to live delta read", func(p *paths) []time.Duration { return p.tokenToChunk }},
	} {
		n := i + 1
		figure(fmt.Sprintf("F%da", n), p.name, 1, 50, p.get(lone["baton"]), p.get(lone["floor"]))
		figure(fmt.Sprintf("F%db", n), p.name, 1, 99, p.get(lone["baton"]), p.get(lone["floor"]))
		figure(fmt.Sprintf("F%dc", n), p.name, manyChats, 50, p.get(many["baton"]), p.get(many["floor"]))
		figure(fmt.Sprintf("F%dd", n), p.name, manyChats, 99, p.get(many["baton"]), p.get(many["floor"]))
	}
	// What each process spends on a chat, opening its events stream
	// included.
	cpuFigure := func(id string, chats int, turns int, baton, floor cpuLap) {
		per := func(l cpuLap) string {
			t := float64(turns)
			return fmt.Sprintf("%.2f / %.2f / %.2f / %.2f ms", ms(l.api)/t, ms(l.relay)/t, ms(l.worker)/t, ms(l.postgres)/t)
		}
		bench.Record(b, bench.Figure{ID: id, Name: fmt.Sprintf("processor time per chat, api / relay / worker / PostgreSQL backends, %s", chatsText(chats)),
			Value: per(baton), Reference: per(floor) + " floor chain", Ratio: ms(baton.total()) / ms(floor.total())})
	}
	cpuFigure("F4a", 1, loneRounds, batonLone, floorLone)
	cpuFigure("F4b", manyChats, manyWaves*manyChats, batonMany, floorMany)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuMeter reads the processor time of one system's processes and of
// its database's server processes, lap by lap.
type cpuMeter struct {
	db    *bench.DB
	procs [3]*bench.Process // api, relay, worker
	last  cpuLap
	lastB map[int]time.Duration
}

// cpuLap is processor time used, by process.
type cpuLap struct{ api, relay, worker, postgres time.Duration }

func (l cpuLap) total() time.Duration { return l.api + l.relay + l.worker + l.postgres }

func newCPUMeter(tb testing.TB, db *bench.DB, api, relay, worker *bench.Process) *cpuMeter {
	m := &cpuMeter{db: db, procs: [3]*bench.Process{api, relay, worker}}
	m.lap(tb)
	return m
}

// lap returns the processor time used since the last lap.
func (m *cpuMeter) lap(tb testing.TB) cpuLap {
	var now [3]time.Duration
	for i, p := range m.procs {
		d, err := p.CPU()
		if err != nil {
			tb.Fatal(err)
		}
		now[i] = d
	}
	backends := m.db.BackendCPU(tb)
	l := cpuLap{api: now[0] - m.last.api, relay: now[1] - m.last.relay, worker: now[2] - m.last.worker,
		postgres: bench.CPUSince(backends, m.lastB)}
	m.last, m.lastB = cpuLap{api: now[0], relay: now[1], worker: now[2]}, backends
	return l
}

func chatsText(n int) string {
	if n == 1 {
		return "one chat at a time"
	}
	return fmt.Sprintf("%s chats at once", bench.Thousands(float64(n)))
}

// profile records where Baton's processes and the chain's spend their
// processor time over the measured run, when BATON_BENCH_PERF names a
// folder (see bench.Profile).
func profile(b *testing.B, s *bench.Stack, chain *floor.Chain) (stop func()) {
	var stops []func()
	for label, p := range map[string]*bench.Process{"baton-api": s.API, "baton-relay": s.Relay, "baton-worker": s.Worker,
		"floor-api": chain.API, "floor-relay": chain.Relay, "floor-worker": chain.Worker} {
		stops = append(stops, p.Profile(b, "floor-"+label))
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}
