package agent_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
)

// Turns of 10 rounds of 10 tool calls (results of 20 KiB, over the cap),
// against the fake server, in conversations of ~1,000-token messages.
// Run with:
//
//	go test -run '^$' -bench 'BenchmarkTurn' -benchtime 1x ./agent/
//
// (-benchtime 1x for the growing conversation, which runs its 2,000 turns
// once; BenchmarkTurnAtLength sizes itself.)
const (
	benchRounds = 10
	benchCalls  = 10
	benchSize   = 3000
)

func benchAgent(b *testing.B) (*agent.OpenAI, *agent.Registry) {
	srv := agenttest.NewResponder(b, toolTurns(benchRounds, benchCalls, nil))
	reg := agent.NewRegistry(lookup(20 << 10))
	a := newAgent(b, srv, func(c *agent.Config) {
		c.SystemPrompt = systemPrompt
		c.MaxModelCalls = benchRounds + 1
	})
	return a, reg
}

// benchExecutor runs the benchmark's tools with room for its rounds.
func benchExecutor(reg *agent.Registry) *executor {
	ex := newExecutor(reg)
	ex.maxTools = benchRounds
	return ex
}

// BenchmarkTurnAtLength is the latency of one turn in a conversation of
// 10 and of 2,000 earlier messages.
func BenchmarkTurnAtLength(b *testing.B) {
	for _, n := range []int64{10, 2000} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			a, reg := benchAgent(b)
			conv := &conversation{n: n, size: benchSize}
			b.ReportAllocs()
			for b.Loop() {
				turn := conv.turn("Look these up and sum them.", consumer.DefaultHistoryLimit)
				if _, err := run(context.Background(), a, turn, benchExecutor(reg)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTurnsOfAGrowingConversation runs 2,000 turns of one
// conversation that grows by a question and an answer each turn, and
// reports the heap after a GC at turn 10 and at turn 2,000, and the mean
// latency of the ten turns from turn 10, 100 and 1,000, and of the last
// ten.
func BenchmarkTurnsOfAGrowingConversation(b *testing.B) {
	const turns = 2000
	windows := []int{10, 100, 1000, turns - 9}
	latency := make([]time.Duration, len(windows))
	var heap10, heap2000 uint64
	for b.Loop() {
		a, reg := benchAgent(b)
		conv := &conversation{size: benchSize}
		var ms runtime.MemStats
		for k := 1; k <= turns; k++ {
			conv.n = int64(2 * (k - 1))
			turn := conv.turn("Look these up and sum them.", consumer.DefaultHistoryLimit)
			start := time.Now()
			if _, err := run(context.Background(), a, turn, benchExecutor(reg)); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			for i, w := range windows {
				if k >= w && k < w+10 {
					latency[i] += took / 10
				}
			}
			if k == 10 || k == turns {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				if k == 10 {
					heap10 = ms.HeapAlloc
				} else {
					heap2000 = ms.HeapAlloc
				}
			}
		}
	}
	b.ReportMetric(float64(heap10)/(1<<20), "heap-MiB@turn10")
	b.ReportMetric(float64(heap2000)/(1<<20), "heap-MiB@turn2000")
	b.ReportMetric(float64(latency[0].Microseconds())/1000, "ms/turn@turn10")
	b.ReportMetric(float64(latency[len(latency)-1].Microseconds())/1000, "ms/turn@turn2000")
	b.Logf("HeapAlloc after GC: turn 10 %.2f MiB, turn 2000 %.2f MiB", float64(heap10)/(1<<20), float64(heap2000)/(1<<20))
	for i, w := range windows {
		b.Logf("mean latency of turns %d-%d: %s", w, w+9, latency[i].Round(time.Microsecond))
	}
}
