package schema

import (
	"context"
	"errors"
)

// MarkRun records a run's end when it committed nothing else: cancelled
// (its conversation was deleted) or abandoned (it lost its lease). A run
// that recovery already closed keeps that outcome.
func MarkRun(ctx context.Context, db Executor, runID, status, reason string) error {
	if status != "cancelled" && status != "abandoned" {
		return errors.New("mark run: status must be cancelled or abandoned")
	}
	_, err := db.Exec(ctx, `
		UPDATE agent_runs SET status = $2, error = $3, finished_at = clock_timestamp()
		WHERE id = $1 AND status = 'running'`, runID, status, reason)
	return err
}
