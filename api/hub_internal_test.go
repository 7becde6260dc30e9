package api

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// TestTheHubDropsDeltasForAFullListenerAndCountsThem: a stream whose
// client is slower than the deltas loses previews, never blocks the hub
// (and with it every other stream of the process), and the drops are
// counted as slow_client; every listener of the conversation gets the same
// rendered frame, which tells the run's own deltas from a forgery.
func TestTheHubDropsDeltasForAFullListenerAndCountsThem(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	h := newHub(nil, nil, batonnats.EventsConfig{}, zerolog.Nop(), m.dropped.WithLabelValues(dropSlowClient))
	const key = "c_key"
	slow, _ := h.listen(key)
	fast, _ := h.listen(key)
	defer h.forget(key, slow)
	defer h.forget(key, fast)

	delta := func(subjectRun, bodyRun string, seq int64) *natsclient.Msg {
		body, err := json.Marshal(batonnats.LiveDelta{RunID: bodyRun, Seq: seq, Type: batonnats.DeltaText, Text: "x"})
		require.NoError(t, err)
		return &natsclient.Msg{Subject: batonnats.LiveSubject(key, subjectRun), Data: body}
	}
	const extra = 5
	for i := range listenerDeltas + extra {
		h.delta(delta("run_1", "run_1", int64(i+1)))
		// The fast listener keeps up.
		d := <-fast.deltas
		require.True(t, d.fromRun)
		require.Equal(t, "run_1", d.runID)
		require.Contains(t, string(d.frame), "event: delta\ndata: {")
	}
	require.Len(t, slow.deltas, listenerDeltas, "the slow listener's buffer is full")
	var out dto.Metric
	require.NoError(t, m.dropped.WithLabelValues(dropSlowClient).Write(&out))
	require.Equal(t, float64(extra), out.GetCounter().GetValue(), "each delta the slow listener could not take is counted")

	<-slow.deltas
	h.delta(delta("run_2", "run_1", 1))
	forged := <-fast.deltas
	require.False(t, forged.fromRun, "a delta on another run's subject is not that run's")
	require.Len(t, slow.deltas, listenerDeltas, "room again: the slow listener takes the next one")
}

// TestAHubThatCouldNotStartTriesAgain: an API that found no events stream
// (or no NATS) when the first client asked must not refuse live events
// for the rest of its life: once the stream is there, the next client
// after the retry interval gets a hub that follows it; a closed hub never
// starts again.
func TestAHubThatCouldNotStartTriesAgain(t *testing.T) {
	n := testenv.StartNATS(t)
	nc, js := n.Connect(t)
	cfg := batonnats.EventsConfig{Name: "HUB_RETRY", SubjectPrefix: "hubretry"}.WithDefaults()
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	h := newHub(js, nc, cfg, zerolog.Nop(), m.dropped.WithLabelValues(dropSlowClient))
	h.retry = time.Hour
	defer h.close()

	first := h.start()
	require.Error(t, first, "no events stream yet")
	require.Equal(t, first, h.start(), "within the retry interval the last error stands")

	_, _, err = batonnats.ProvisionEventsStream(context.Background(), js, cfg, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	require.Equal(t, first, h.start(), "the stream is there, but within the retry interval the last error still stands")
	// The interval passes.
	h.startMu.Lock()
	h.lastTry = h.lastTry.Add(-h.retry)
	h.startMu.Unlock()
	require.NoError(t, h.start(), "the next call after the interval follows the stream")
	require.NoError(t, h.start())

	h.close()
	require.ErrorIs(t, h.start(), errHubClosed)
}
