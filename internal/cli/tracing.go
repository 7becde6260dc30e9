package cli

import (
	"context"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"

	"github.com/batonhq/baton/internal/telemetry"
)

// startTracing turns tracing on for component when the OTEL_* variables
// name an OTLP endpoint, and returns the function that flushes what is
// left; a tracing setup that fails is logged, and the component runs
// without it.
func startTracing(ctx context.Context, component string, log zerolog.Logger) func() {
	shutdown, err := telemetry.Setup(ctx, component)
	if err != nil {
		log.Warn().Err(err).Msg("tracing is off: the OTEL_* settings cannot be used")
		return func() {}
	}
	if telemetry.Enabled() {
		// The SDK's own errors (a collector that cannot be reached, say)
		// go to the component's log, not to a bare line on stderr.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			log.Warn().Err(err).Msg("tracing: spans could not be exported")
		}))
		log.Info().Msg("tracing on: spans go to the OTLP endpoint of the OTEL_* variables")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	}
}
