package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SupersedeTx hands a run's turn back, in the caller's transaction, so
// that the next claim answers the claimed messages together with newer
// ones of the same conversation: the rows go back to pending without the
// attempt counting (the attempt did not fail), the lease is released and
// the run is recorded as superseded. It does so only while the run owns
// the conversation and started no write (a side effect may have happened:
// that turn must end with its own reply or error) and, with onlyIfNewer,
// only when a newer message is pending; it reports whether it did. A run
// that was asked to stop is never handed back: ErrStopRequested, and the
// caller ends it stopped.
func SupersedeTx(ctx context.Context, tx Executor, conversationID, runID string, outboxIDs []int64, onlyIfNewer bool) (bool, error) {
	var ok, stop bool
	err := tx.QueryRow(ctx, `
		SELECT NOT EXISTS (SELECT 1 FROM operations o WHERE o.effect = 'write' AND (o.run_id = $2
				OR (o.conversation_id = $1 AND o.turn_id = (SELECT turn_id FROM agent_runs WHERE id = $2))))
			AND (NOT $3 OR EXISTS (SELECT 1 FROM agent_outbox WHERE conversation_id = $1 AND status = 'pending')),
			coalesce(stop_run_id = run_id, false)
		FROM conversations WHERE id = $1 AND run_id = $2 FOR NO KEY UPDATE`, conversationID, runID, onlyIfNewer).Scan(&ok, &stop)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ownershipError(ctx, tx, conversationID)
	}
	if err != nil {
		return false, fmt.Errorf("supersede: %w", err)
	}
	if stop {
		return false, ErrStopRequested
	}
	if !ok {
		return false, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE conversations SET run_id = NULL, lease_expires_at = NULL WHERE id = $1 AND run_id = $2`, conversationID, runID); err != nil {
		return false, fmt.Errorf("supersede: release conversation: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE agent_outbox SET status = 'pending', attempts = greatest(attempts - 1, 0), run_id = NULL, steps_turn_id = NULL
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, outboxIDs, runID)
	if err != nil {
		return false, fmt.Errorf("supersede: rows back to pending: %w", err)
	}
	if tag.RowsAffected() != int64(len(outboxIDs)) {
		return false, fmt.Errorf("%w: %d of %d claimed rows are still processing for run %s", ErrLeaseLost, tag.RowsAffected(), len(outboxIDs), runID)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE agent_runs SET status = 'superseded', error = 'newer messages arrived before the reply: the next turn answers them together', finished_at = clock_timestamp()
		WHERE id = $1`, runID); err != nil {
		return false, fmt.Errorf("supersede: record run: %w", err)
	}
	return true, nil
}
