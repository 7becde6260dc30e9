package agent_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/telemetry"
)

// TestEachModelCallIsASpanOfTheTurn: every request to the model server,
// the retried one too, is a client span under the turn's span, with the
// model, the outcome and no content. Not parallel: it installs the
// process's tracer provider.
func TestEachModelCallIsASpanOfTheTurn(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	srv := agenttest.NewServer(t,
		agenttest.Response{Content: "Let me check.", ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "weather", Arguments: `{"city":"Lima"}`}}},
		agenttest.Response{Status: 502, Body: `{"error":{"message":"upstream"}}`},
		agenttest.Response{Content: "Sunny in Lima, the secret is 42."},
	)
	var n int
	var mu sync.Mutex
	reg := agent.NewRegistry(weather(&n, &mu))
	a := newAgent(t, srv, nil)

	ctx, turn := telemetry.Tracer().Start(context.Background(), "turn")
	_, err := run(ctx, a, turnOf("weather in Lima? my secret is 42"), newExecutor(reg))
	require.NoError(t, err)
	turn.End()

	var calls []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "chat test-model" {
			calls = append(calls, s)
		}
	}
	require.Len(t, calls, 3, "one span per request: the tool round, the failed call and its retry")
	for i, s := range calls {
		require.Equal(t, turn.SpanContext().TraceID(), s.SpanContext().TraceID())
		require.Equal(t, turn.SpanContext().SpanID(), s.Parent().SpanID(), "call %d is a child of the turn", i)
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
			require.NotContains(t, kv.Value.String(), "secret", "a span carries no content")
		}
		require.Equal(t, "test-model", attrs["gen_ai.request.model"].AsString())
		require.Equal(t, int64(i+1), attrs["baton.model_call"].AsInt64())
	}
	require.Equal(t, codes.Unset, calls[0].Status().Code)
	require.Equal(t, []string{"tool_calls"}, attrsOf(calls[0])["gen_ai.response.finish_reasons"].AsStringSlice())
	require.Equal(t, codes.Error, calls[1].Status().Code, "the 502 is an error span")
	require.Equal(t, int64(502), attrsOf(calls[1])["http.response.status_code"].AsInt64())
	require.Equal(t, []string{"stop"}, attrsOf(calls[2])["gen_ai.response.finish_reasons"].AsStringSlice())
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}
