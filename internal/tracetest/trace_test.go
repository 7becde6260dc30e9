// Package tracetest proves that one user's message is one trace across the
// broker: the API, the relay, the worker and a consumer group all export
// their spans, through the real OTLP exporter, to an OTLP receiver in the
// test, under the trace id of the request that posted the message.
package tracetest

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/telemetry"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// span is what the test needs of an exported span.
type span struct {
	Name    string
	TraceID string
	Links   []string // trace ids of its links
}

// receiver is an OTLP/HTTP trace receiver.
type receiver struct {
	mu    sync.Mutex
	spans []span
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.URL.Path != "/v1/traces" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := span{Name: s.Name, TraceID: hex.EncodeToString(s.TraceId)}
				for _, l := range s.Links {
					sp.Links = append(sp.Links, hex.EncodeToString(l.TraceId))
				}
				rc.spans = append(rc.spans, sp)
			}
		}
	}
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (rc *receiver) names(traceID string) map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string]int{}
	for _, s := range rc.spans {
		if s.TraceID == traceID {
			out[s.Name]++
		}
	}
	return out
}

func (rc *receiver) find(name, traceID string) []span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []span
	for _, s := range rc.spans {
		if s.Name == name && s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

func traceParent(i int) (header, traceID string) {
	traceID = fmt.Sprintf("%032x", 0xba7000+i)
	return "00-" + traceID + "-" + fmt.Sprintf("%016x", 0x51+i) + "-01", traceID
}

// TestOneMessageIsOneTraceAcrossTheBroker: a message posted with a
// traceparent yields spans of the API, the relay, the worker (the turn,
// its claim, the agent, its tool, the finalize) and a group, all in the
// caller's trace, and the worker's log lines carry the trace id; three
// messages that one turn answers are linked to it.
func TestOneMessageIsOneTraceAcrossTheBroker(t *testing.T) {
	ctx := context.Background()
	rc := &receiver{}
	collector := httptest.NewServer(rc)
	t.Cleanup(collector.Close)
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
	require.NoError(t, err)
	shutdown := telemetry.Install(exp, "test")
	flushed := false
	flush := func() {
		if !flushed {
			flushed = true
			require.NoError(t, shutdown(ctx))
		}
	}
	t.Cleanup(flush)

	b := outboxtest.Setup(t) // database, NATS, relay
	b.RelayStreaming()
	_, _, err = batonnats.ProvisionEventsStream(ctx, b.JS, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)

	var logs testenv.SyncBuffer
	log := zerolog.New(&logs).Level(zerolog.DebugLevel)
	w, err := consumer.New(consumer.Config{
		Stream: b.Stream, Agent: consumer.Echo{Directives: true},
		Lease: 5 * time.Second, Logger: &log,
	}, b.DB.Pool, b.JS)
	require.NoError(t, err)
	g, err := group.New(group.Config{Name: group.AuditGroup, Handler: group.Audit, Stream: b.Stream}, b.DB.Pool, b.JS)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{w.Run, g.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, run(runCtx))
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	token, _, err := schema.CreateToken(ctx, b.DB.Pool, "tracer")
	require.NoError(t, err)
	srv, err := api.New(api.Config{}, b.DB.Pool, b.JS)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	post := func(path, traceparent string, body any) {
		t.Helper()
		data, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest("POST", hs.URL+path, bytes.NewReader(data))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := hs.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, path)
	}
	post("/v1/conversations", "", map[string]string{"id": "traced"})
	post("/v1/conversations", "", map[string]string{"id": "burst"})

	tp, traceID := traceParent(0)
	post("/v1/conversations/traced/messages", tp, map[string]string{"id": "m1", "content": "look\n/tool lookup abc"})
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id = 'traced' AND m.role = 'assistant'`) == 1 &&
			b.Count(`SELECT count(*) FROM audit_events`) == 1
	}, "the reply and the audit row")

	// Three messages one turn answers: each request's trace.
	var burst []string
	for i := 1; i <= 3; i++ {
		tp, id := traceParent(i)
		burst = append(burst, id)
		post("/v1/conversations/burst/messages", tp, map[string]string{"id": fmt.Sprintf("b%d", i), "content": fmt.Sprintf("part %d", i)})
	}
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id = 'burst' AND m.role = 'assistant'`) >= 1 &&
			b.Count(`SELECT count(*) FROM agent_outbox WHERE status <> 'done'`) == 0
	}, "the burst's replies")
	cancel()
	wg.Wait()
	flush()

	got := rc.names(traceID)
	for _, name := range []string{"POST /v1/conversations/{cid}/messages", "relay publish", "turn", "claim", "agent", "tool lookup", "finalize", "group audit"} {
		require.Positive(t, got[name], "span %q in the request's trace; the trace has %v", name, got)
	}
	require.Contains(t, logs.String(), `"trace_id":"`+traceID+`"`, "the worker's log lines carry the trace id")

	// The turn that answered the whole burst continues the trace of its
	// first message and links the others.
	var linked bool
	for _, first := range burst {
		for _, s := range rc.find("turn", first) {
			others := map[string]bool{}
			for _, l := range s.Links {
				others[l] = true
			}
			n := 0
			for _, id := range burst {
				if id != first && others[id] {
					n++
				}
			}
			linked = linked || n == len(burst)-1
		}
	}
	if !linked {
		for _, id := range burst {
			t.Logf("trace %s: %v turns %+v", id, rc.names(id), rc.find("turn", id))
		}
		t.Logf("replies: %d", b.Count(`SELECT count(*) FROM agent_runs WHERE status = 'finalized'`))
	}
	require.True(t, linked, "a turn of the burst links the other messages' traces: %s", strings.Join(burst, ", "))
}
