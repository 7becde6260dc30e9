package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// BenchmarkAgentStep measures what Baton adds to each step of an external
// agent, against the agent's own time, with real `baton api` (serving the
// agent key), `baton relay` and `baton worker --agent ag-ui` processes and
// an AG-UI agent served by the benchmark, which verifies every request's
// token against the API's keys, answers each step with 20 text chunks 25
// ms apart, and stamps what it does:
//
//   - step start: the claim (the run's agent_runs.started_at,
//     clock_timestamp() in the statement that takes the turn's rows) to the
//     step request reaching the agent's handler;
//
//   - chunk: a text chunk written and flushed by the agent to the same text
//     read by a client of GET /v1/conversations/{cid}/events;
//
//   - stop: POST /v1/conversations/{cid}/stop sent, as the client reads
//     the turn's first chunk, to the agent seeing its request's connection
//     close;
//
// with one turn at a time (200 answered turns, then 200 stopped, one after
// another, each in a conversation of its own) and with 200 turns at once
// (200 answered, then 200 stopped). The references are the agent's own
// time to answer a step (request to RUN_FINISHED flushed) and to write a
// chunk. Stamps of the same events on NATS beside the API (the processing
// event's time, each live delta, each stop notice) split each figure
// between the processes; they are logged.
//
//	go test -run '^$' -bench BenchmarkAgentStep -benchtime 1x ./agent/
func BenchmarkAgentStep(b *testing.B) {
	for range b.N {
		agentStepOnce(b)
	}
}

const (
	stepTurns      = 200 // one at a time: as many answered, then as many stopped
	stepAtOnce     = 200 // at once: as many answered, then as many stopped
	stepWarmUp     = 5
	stepChunks     = 20
	stepChunkEvery = 25 * time.Millisecond
	// stopChunks is 10 s of text: more than any stop takes to arrive.
	stopChunks = 400
	// stepAim is the aim of each overhead at p99, one turn at a time.
	stepAim = 2 * time.Millisecond
)

// stepStamps is what the agent, the client and a NATS subscriber beside
// the API stamped. Turns are known by their key (each in the conversation
// of that id, its message's text "answer <key>" or "stop <key>"), chunks
// by their text ("<key>.<n>"), runs' conversations by server key.
type stepStamps struct {
	mu    sync.Mutex
	turns map[string]*stepTurn
	// By chunk: written and flushed by the agent, with the agent's time
	// to write it; published by the worker as a live delta; read by the
	// client.
	written, published, read map[string]time.Time
	took                     map[string]time.Duration
	// By conversation (server key): the processing event's time, stamped
	// by the worker once the claim committed; a stop notice on NATS.
	processing, stopNotice map[string]time.Time
}

// stepTurn is one turn's step as the agent and the client saw it.
type stepTurn struct {
	conv, turnID      string // server key and turn id, from the step request
	requests          int
	arrived, finished time.Time
	gone, stopSent    time.Time
}

func newStepStamps() *stepStamps {
	return &stepStamps{turns: map[string]*stepTurn{}, written: map[string]time.Time{}, published: map[string]time.Time{},
		read: map[string]time.Time{}, took: map[string]time.Duration{}, processing: map[string]time.Time{}, stopNotice: map[string]time.Time{}}
}

// turn changes the turn of key under the lock.
func (st *stepStamps) turn(key string, f func(*stepTurn)) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.turns[key]
	if t == nil {
		t = &stepTurn{}
		st.turns[key] = t
	}
	f(t)
}

// first records at under k in m unless something is there already.
func (st *stepStamps) first(m map[string]time.Time, k string, at time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := m[k]; !ok {
		m[k] = at
	}
}

func agentStepOnce(b *testing.B) {
	ctx := context.Background()
	bin := bench.Binary(b)
	pg := bench.StartPostgres(b, nil)
	ns := testenv.StartNATS(b)
	stamps := newStepStamps()

	keys := b.TempDir()
	signing, public := filepath.Join(keys, "agent.key"), filepath.Join(keys, "agent.pub")
	if out, err := bench.Run(bin, "agent-key", "create", "--private-key", signing, "--public-key", public); err != nil {
		b.Fatalf("agent-key create: %v\n%s", err, out)
	}
	agent := bench.NewAgent(b, func(req bench.AgentRequest) bench.AgentReply {
		verb, key, _ := strings.Cut(req.LastUser(), " ")
		stamps.turn(key, func(t *stepTurn) {
			t.requests++
			if t.arrived.IsZero() {
				t.arrived, t.conv, t.turnID = req.At, req.ThreadID, req.Turn
			}
		})
		n := stepChunks
		if verb == "stop" {
			n = stopChunks
		}
		chunks := make([]string, n)
		for i := range chunks {
			chunks[i] = fmt.Sprintf("%s.%d ", key, i)
		}
		return bench.AgentReply{Chunks: chunks, ChunkDelay: stepChunkEvery,
			Sent: func(i int, at time.Time, took time.Duration) {
				tok := strings.TrimSpace(chunks[i])
				stamps.first(stamps.written, tok, at)
				stamps.mu.Lock()
				stamps.took[tok] = took
				stamps.mu.Unlock()
			},
			Done: func(at time.Time) { stamps.turn(key, func(t *stepTurn) { t.finished = at }) },
			Gone: func(at time.Time) { stamps.turn(key, func(t *stepTurn) { t.gone = at }) }}
	})
	s := bench.StartStack(b, pg, bench.StackOptions{Binary: bin, NATSURL: ns.URL, NoWorker: true,
		APIArgs: []string{"--agent-public-key", public, "--messages-per-minute", "1000000", "--message-burst", "100000",
			"--max-conversations=-1", "--max-streams", "2000", "--max-streams-per-user", "2000"}})
	agent.Trust(b, s.APIURL)
	s.Worker = s.StartWorker(b, "", "--agent", "ag-ui", "--agent-url", agent.URL(), "--agent-signing-key", signing,
		"--concurrency", "256", "--agent-max-in-flight", "256")
	// Room for every stream and request of 200 turns at once, kept idle
	// between them.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	b.Cleanup(client.CloseIdleConnections)
	s.HTTP = client

	// Beside the API: the processing events, the live deltas, the stop
	// notices.
	nc, _ := ns.Connect(b)
	subscribe := func(subject string, f func(*natsclient.Msg, time.Time)) {
		if _, err := nc.Subscribe(subject, func(m *natsclient.Msg) { f(m, time.Now()) }); err != nil {
			b.Fatal(err)
		}
	}
	subscribe(batonnats.DefaultEventsPrefix+".>", func(m *natsclient.Msg, _ time.Time) {
		var ev batonnats.ConversationEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == batonnats.EventProcessing {
			stamps.first(stamps.processing, ev.ConversationID, ev.At)
		}
	})
	subscribe(batonnats.LivePrefix+".>", func(m *natsclient.Msg, at time.Time) {
		if d, err := batonnats.ParseLiveDelta(m.Data); err == nil && d.Type == batonnats.DeltaText {
			for _, tok := range strings.Fields(d.Text) {
				stamps.first(stamps.published, tok, at)
			}
		}
	})
	subscribe(batonnats.StopPrefix+".>", func(m *natsclient.Msg, at time.Time) {
		if conv, _, err := batonnats.ParseRunSubject(batonnats.StopPrefix, m.Subject); err == nil {
			stamps.first(stamps.stopNotice, conv, at)
		}
	})

	r := &stepRun{b: b, s: s, client: client, stamps: stamps}
	r.createConversations(ctx, "warm", stepWarmUp*2)
	for _, level := range []string{"one", "many"} {
		r.createConversations(ctx, level, stepTurns+stepAtOnce)
	}
	for i := range stepWarmUp {
		r.turns(ctx, []string{fmt.Sprintf("warm-%d", i)}, false)
		r.turns(ctx, []string{fmt.Sprintf("warm-%d", stepWarmUp+i)}, true)
	}
	b.ResetTimer()

	stopWorker, stopAPI := s.Worker.Profile(b, "worker-agent-step"), s.API.Profile(b, "api-agent-step")
	for i := range stepTurns {
		r.turns(ctx, []string{fmt.Sprintf("one-%d", i)}, false)
	}
	for i := range stepTurns {
		r.turns(ctx, []string{fmt.Sprintf("one-%d", stepTurns+i)}, true)
	}
	stopWorker()
	stopAPI()
	onePeak := agent.Peak()
	many := func(from int) []string {
		out := make([]string, stepAtOnce)
		for i := range out {
			out[i] = fmt.Sprintf("many-%d", from+i)
		}
		return out
	}
	r.turns(ctx, many(0), false)
	r.turns(ctx, many(stepAtOnce), true)
	manyPeak := agent.Peak()
	b.StopTimer()
	if n := agent.Refused(); n > 0 {
		b.Errorf("the agent refused %d step requests for their token", n)
	}

	// The splits first: a benchmark's log shows its first ten lines, the
	// report every figure.
	one, atOnce := r.measure(ctx, "one", stepTurns), r.measure(ctx, "many", stepAtOnce)
	b.Logf("steps in flight at the agent at most: %d one turn at a time, %d with %d at once", onePeak, manyPeak, stepAtOnce)
	oneLevel, manyLevel := "1 turn at a time", fmt.Sprintf("%d turns at once", stepAtOnce)
	one.logSplits(b, oneLevel)
	atOnce.logSplits(b, manyLevel)
	one.record(b, "9a", oneLevel, "", true)
	atOnce.record(b, "9g", manyLevel, fmt.Sprintf("; at most %d steps in flight at the agent", manyPeak), false)
}

// stepRun runs the benchmark's turns.
type stepRun struct {
	b      *testing.B
	s      *bench.Stack
	client *http.Client
	stamps *stepStamps
}

// createConversations creates conversations "<prefix>-0" to
// "<prefix>-<n-1>" through the API, 16 at a time.
func (r *stepRun) createConversations(ctx context.Context, prefix string, n int) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id := fmt.Sprintf("%s-%d", prefix, i)
			status, body, err := r.s.Do(ctx, http.MethodPost, "/v1/conversations", map[string]string{"id": id})
			if err != nil || status != http.StatusCreated {
				r.b.Errorf("create conversation %s: %d %s %v", id, status, body, err)
			}
		})
	}
	wg.Wait()
	if r.b.Failed() {
		r.b.FailNow()
	}
}

// turns runs a turn in each conversation of keys at once, and returns
// when the client has read each turn's end: the events streams open
// first, then every message is posted together. A turn to stop is
// stopped as its client reads its first chunk.
func (r *stepRun) turns(ctx context.Context, keys []string, stop bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	verb := "answer"
	if stop {
		verb = "stop"
	}
	ended := make([]chan struct{}, len(keys))
	waits := make([]func(), len(keys))
	// Each stop is asked before its turn can end: every one has started
	// once every turn has ended.
	var stops sync.WaitGroup
	for i, key := range keys {
		ended[i] = make(chan struct{})
		var end sync.Once
		stopping := false // the reader's alone
		wait, err := r.s.Follow(ctx, r.client, key, func(ev bench.Event) {
			switch ev.Name {
			case "delta":
				var d batonnats.LiveDelta
				if json.Unmarshal(ev.Data, &d) != nil || d.Type != batonnats.DeltaText {
					return
				}
				for _, tok := range strings.Fields(d.Text) {
					r.stamps.first(r.stamps.read, tok, ev.At)
				}
				if stop && !stopping {
					stopping = true
					stops.Go(func() { r.stop(ctx, key) })
				}
			case "":
				var ce batonnats.ConversationEvent
				if json.Unmarshal(ev.Data, &ce) != nil {
					return
				}
				switch ce.Type {
				case batonnats.EventReplied, batonnats.EventStopped:
					end.Do(func() { close(ended[i]) })
				case batonnats.EventFailed, batonnats.EventCancelled:
					r.b.Errorf("turn %s: %s", key, ce.Type)
					end.Do(func() { close(ended[i]) })
				}
			}
		})
		if err != nil {
			r.b.Fatal(err)
		}
		waits[i] = wait
	}
	var posted sync.WaitGroup
	for _, key := range keys {
		posted.Go(func() {
			if err := r.s.Post(ctx, key, "m-"+key, verb+" "+key); err != nil {
				r.b.Error(err)
			}
		})
	}
	posted.Wait()
	deadline := time.After(2 * time.Minute)
	for i, key := range keys {
		select {
		case <-ended[i]:
		case <-deadline:
			r.b.Errorf("turn %s: the client did not read its end within 2 minutes", key)
		}
	}
	stops.Wait()
	cancel()
	for _, wait := range waits {
		wait()
	}
}

// stop asks the API to stop the turn of key, stamping when it asked.
func (r *stepRun) stop(ctx context.Context, key string) {
	r.stamps.turn(key, func(t *stepTurn) { t.stopSent = time.Now() })
	status, body, err := r.s.Do(ctx, http.MethodPost, "/v1/conversations/"+key+"/stop", nil)
	if err != nil || status != http.StatusOK || !strings.Contains(string(body), `"stopped":true`) {
		r.b.Errorf("stop %s: %d %s %v", key, status, body, err)
	}
}

// stepFigures are the samples of one level of concurrency, each overhead
// with its reference and its split at the NATS subscriber.
type stepFigures struct {
	start, chunk, stop []time.Duration
	// stepTime is the agent's own time to answer a step, chunkTime to
	// write a chunk.
	stepTime, chunkTime []time.Duration
	// The splits: claim to the processing event's time, and from there
	// to the request; chunk to its live delta on NATS, and from there to
	// the client; stop to the stop notice on NATS, and from there to the
	// agent.
	claimCommit, workerRequest, chunkWorker, chunkAPI, stopAPI, stopWorker []time.Duration
	steps, stopped                                                         int
}

// measure gathers the samples of the turns "<level>-0" to
// "<level>-<2n-1>": the first n answered, the others stopped.
func (r *stepRun) measure(ctx context.Context, level string, n int) stepFigures {
	st := r.stamps
	st.mu.Lock()
	defer st.mu.Unlock()
	var turnIDs []string
	for i := range 2 * n {
		if t := st.turns[fmt.Sprintf("%s-%d", level, i)]; t != nil {
			turnIDs = append(turnIDs, t.turnID)
		}
	}
	rows, err := r.s.DB.Pool.Query(ctx, `SELECT turn_id, min(started_at), count(*) FROM agent_runs WHERE turn_id = ANY($1) GROUP BY turn_id`, turnIDs)
	if err != nil {
		r.b.Fatal(err)
	}
	defer rows.Close()
	claimed := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		var runs int
		if err := rows.Scan(&id, &at, &runs); err != nil {
			r.b.Fatal(err)
		}
		claimed[id] = at
		if runs > 1 {
			r.b.Errorf("turn %s had %d runs, want 1", id, runs)
		}
	}
	if err := rows.Err(); err != nil {
		r.b.Fatal(err)
	}
	var f stepFigures
	for i := range 2 * n {
		key := fmt.Sprintf("%s-%d", level, i)
		t := st.turns[key]
		if t == nil {
			r.b.Errorf("turn %s: no step request reached the agent", key)
			continue
		}
		if t.requests != 1 {
			r.b.Errorf("turn %s: %d step requests reached the agent, want 1", key, t.requests)
		}
		if at, ok := claimed[t.turnID]; ok {
			f.steps++
			f.start = append(f.start, t.arrived.Sub(at))
			if p, ok := st.processing[t.conv]; ok {
				f.claimCommit = append(f.claimCommit, p.Sub(at))
				f.workerRequest = append(f.workerRequest, t.arrived.Sub(p))
			}
		}
		if i < n {
			if !t.finished.IsZero() {
				f.stepTime = append(f.stepTime, t.finished.Sub(t.arrived))
			}
			for c := range stepChunks {
				tok := fmt.Sprintf("%s.%d", key, c)
				written, ok1 := st.written[tok]
				read, ok2 := st.read[tok]
				if !ok1 || !ok2 {
					r.b.Errorf("chunk %s: written %v, read by the client %v", tok, ok1, ok2)
					continue
				}
				f.chunk = append(f.chunk, read.Sub(written))
				f.chunkTime = append(f.chunkTime, st.took[tok])
				if p, ok := st.published[tok]; ok {
					f.chunkWorker = append(f.chunkWorker, p.Sub(written))
					f.chunkAPI = append(f.chunkAPI, read.Sub(p))
				}
			}
			continue
		}
		if t.gone.IsZero() || t.stopSent.IsZero() {
			r.b.Errorf("turn %s: stop sent %v, the agent saw its request close %v", key, !t.stopSent.IsZero(), !t.gone.IsZero())
			continue
		}
		f.stopped++
		f.stop = append(f.stop, t.gone.Sub(t.stopSent))
		if p, ok := st.stopNotice[t.conv]; ok {
			f.stopAPI = append(f.stopAPI, p.Sub(t.stopSent))
			f.stopWorker = append(f.stopWorker, t.gone.Sub(p))
		}
	}
	return f
}

// logSplits logs where each overhead of one level went, p50 and p99 of
// each part.
func (f stepFigures) logSplits(b *testing.B, level string) {
	pct := func(ds []time.Duration) string {
		return bench.Ms(bench.Percentile(ds, 50)) + " / " + bench.Ms(bench.Percentile(ds, 99))
	}
	b.Logf("%s, split at NATS beside the API, p50 / p99: claim to the processing event's time %s, then to the request at the agent %s; "+
		"chunk to its live delta %s, then to the client %s; stop to the stop notice %s, then to the agent seeing the close %s",
		level, pct(f.claimCommit), pct(f.workerRequest), pct(f.chunkWorker), pct(f.chunkAPI), pct(f.stopAPI), pct(f.stopWorker))
}

// record records the six figures of one level from id on (its letter and
// the five after it), with the aim when aim is set.
func (f stepFigures) record(b *testing.B, id, level, note string, aim bool) {
	p := bench.Percentile
	letter := id[len(id)-1]
	next := func(k int) string { return id[:len(id)-1] + string(letter+byte(k)) }
	fig := func(k int, name string, v, ref []time.Duration, refName string, pct float64) {
		val, rv := p(v, pct), p(ref, pct)
		fg := bench.Figure{ID: next(k), Name: name, Value: bench.Ms(val), Reference: bench.Ms(rv) + " " + refName}
		if rv > 0 {
			fg.Ratio = float64(val) / float64(rv)
		}
		if aim && pct == 99 {
			fg.Aim, fg.Met = "≤ "+bench.Ms(stepAim), bench.Verdict(val <= stepAim)
		}
		bench.Record(b, fg)
	}
	stepRef := fmt.Sprintf("the agent's own time to answer a step (%d steps of %d chunks %s apart)", len(f.stepTime), stepChunks, stepChunkEvery)
	chunkRef := "the agent's own time to write a chunk"
	fig(0, fmt.Sprintf("agent step start: the claim (agent_runs.started_at) to the step request at the agent, %s, p50 (%d steps: %d answered, %d stopped%s)",
		level, f.steps, len(f.stepTime), f.stopped, note), f.start, f.stepTime, stepRef, 50)
	fig(1, "same, p99", f.start, f.stepTime, stepRef, 99)
	fig(2, fmt.Sprintf("agent chunk: a text chunk flushed by the agent to the client reading it from GET .../events, %s, p50 (%s chunks)",
		level, bench.Thousands(float64(len(f.chunk)))), f.chunk, f.chunkTime, chunkRef, 50)
	fig(3, "same, p99", f.chunk, f.chunkTime, chunkRef, 99)
	fig(4, fmt.Sprintf("agent stop: POST .../stop sent to the agent seeing its request's connection close, %s, p50 (%d stops)", level, len(f.stop)),
		f.stop, f.stepTime, stepRef, 50)
	fig(5, "same, p99", f.stop, f.stepTime, stepRef, 99)
}
