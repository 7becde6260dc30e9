//go:build chaosbroken

package consumer

import (
	"context"

	"github.com/batonhq/baton/schema"
)

// The chaos harness's own test runs workers built with the chaosbroken tag,
// whose finalize commits in two transactions with the
// after_finalize_before_ack crash point between them (schema.FinalizeSplit):
// the harness must fail such a build.
func init() {
	commitFinalize = func(ctx context.Context, w *Worker, f schema.Finalize) (schema.Finalized, error) {
		return schema.FinalizeSplit(ctx, w.cfg.Pool, f, func() { w.crash.at(CrashAfterFinalizeBeforeAck) })
	}
}
