//go:build chaosbroken

package consumer

import (
	"context"

	"github.com/batonhq/baton/schema"
)

// The chaos harness's own test runs workers built with the chaosbroken tag,
// whose finalize commits in two transactions with the
// after_finalize_before_ack crash point between them (schema.FinalizeSplit):
// the harness must fail such a build. An armed worker dies between them
// at its first finalize, whatever the armed probability: otherwise it
// could die at the same point after the second transaction instead, and
// the harness's test would find nothing to fail now and then.
func init() {
	commitFinalize = func(ctx context.Context, w *Worker, f schema.Finalize) (schema.Finalized, error) {
		return schema.FinalizeSplit(ctx, w.pool, f, func() { w.crash.always(CrashAfterFinalizeBeforeAck) })
	}
}
