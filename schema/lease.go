package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A lease is a run's ownership of a conversation until an expiry: a claim
// takes it (ClaimTx), a running turn renews it, finalize and recovery
// release it, and every write of a run is fenced by it.

// RenewLease extends a run's lease. It returns ErrLeaseLost when the run no
// longer owns the conversation, and ErrConversationDeleted when the
// conversation is gone. When the run was asked to stop (StopTx), the lease
// is renewed and the error is ErrStopRequested, with the new expiry: the
// run ends stopped, and a worker that missed the notice learns it here.
func RenewLease(ctx context.Context, db Executor, conversationID, runID string, lease time.Duration) (time.Time, error) {
	var until time.Time
	var stop bool
	err := db.QueryRow(ctx, `
		WITH lease AS (
			UPDATE conversations SET lease_expires_at = clock_timestamp() + make_interval(secs => $3)
			WHERE id = $1 AND run_id = $2
			RETURNING lease_expires_at, coalesce(stop_run_id = run_id, false) AS stop),
		run AS (
			UPDATE agent_runs SET lease_expires_at = (SELECT lease_expires_at FROM lease)
			WHERE id = $2 AND EXISTS (SELECT 1 FROM lease))
		SELECT lease_expires_at, stop FROM lease`, conversationID, runID, lease.Seconds()).Scan(&until, &stop)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, ownershipError(ctx, db, conversationID)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("renew lease: %w", err)
	}
	if stop {
		return until, ErrStopRequested
	}
	return until, nil
}

// ownershipError says why a fenced statement matched nothing.
func ownershipError(ctx context.Context, db Executor, conversationID string) error {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM conversations WHERE id = $1)`, conversationID).Scan(&exists); err != nil {
		return fmt.Errorf("check conversation: %w", err)
	}
	if !exists {
		return ErrConversationDeleted
	}
	return ErrLeaseLost
}
