// Package telemetry sets up tracing across Baton's processes with
// OpenTelemetry: the API continues a caller's W3C traceparent, the outbox
// row keeps the trace context, the relay carries it on the JetStream
// message, and the worker and the groups continue it. It is configured by
// the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER,
// ...) and off when no endpoint is set: then every span is a no-op.
package telemetry

import (
	"context"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of Baton's spans.
const Name = "github.com/batonhq/baton"

// HeaderTraceParent is the W3C trace context header, on HTTP requests and
// on the JetStream messages the relay publishes.
const HeaderTraceParent = "traceparent"

func init() {
	// The W3C propagator is set whether or not traces are exported, so a
	// trace context that arrives is passed on either way.
	otel.SetTextMapPropagator(propagation.TraceContext{})
}

// Enabled reports whether the environment asks for traces to be exported.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		os.Getenv("OTEL_TRACES_EXPORTER") == "otlp"
}

// Setup installs a tracer provider that exports to the OTLP endpoint the
// OTEL_* variables name, for the component (relay, worker, api, ...), when
// they name one; otherwise it installs nothing and tracing stays off. The
// returned function flushes and stops the exporter; call it on the way out.
func Setup(ctx context.Context, component string) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	return Install(exp, component), nil
}

// Install makes exp the destination of every span of this process, named
// after the component (OTEL_SERVICE_NAME wins when set), and returns the
// function that flushes and stops it.
func Install(exp sdktrace.SpanExporter, component string) func(context.Context) error {
	name := os.Getenv("OTEL_SERVICE_NAME")
	if name == "" {
		name = "baton-" + component
	}
	res, _ := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown
}

// Tracer is Baton's tracer on the current provider.
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// TraceParent returns the W3C traceparent of ctx's span, or "" when ctx
// carries none: what an outbox row keeps.
func TraceParent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	return carrier[HeaderTraceParent]
}

// FromTraceParent returns ctx carrying the remote span context of a W3C
// traceparent ("" leaves ctx as it is).
func FromTraceParent(ctx context.Context, traceParent string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier{HeaderTraceParent: traceParent})
}

// SpanContextOf returns the span context of a W3C traceparent, valid or
// not.
func SpanContextOf(traceParent string) trace.SpanContext {
	return trace.SpanContextFromContext(FromTraceParent(context.Background(), traceParent))
}

// TraceID returns the trace id of ctx's span, or "" when it has none: log
// lines carry it.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
