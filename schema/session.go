package schema

import (
	"context"
	"fmt"
)

// A worker's session is its liveness as the database sees it: a number
// (NextWorkerSession) whose session-level advisory lock the worker holds
// on a connection of its own for as long as it lives (TakeWorkerSession).
// Every run it claims records the number (ClaimParams.Session). When the
// process dies, its connection closes and the server releases the lock at
// once, so a run whose session's lock is free belongs to a gone worker:
// a claim takes its conversation over at once (ClaimTx, ClaimTurn), and
// RecoverOrphanedTx recovers it without waiting for its lease.
//
// A free lock counts only on a server that has held workers' locks for ten
// seconds (migration 00018): a server that restarted, or a standby just
// promoted, holds none while the live workers reconnect and take theirs
// again, and meanwhile the lease alone decides. A worker that is alive but
// cut off keeps its lock while the server keeps its connection (until TCP
// keepalives or the kernel end it), and the lease decides then too. Either
// way fencing stays the arbiter: every write of a run is conditioned on
// the run still owning its conversation, so a worker that comes back after
// a takeover writes nothing.

// RecoveryReasonSessionEnded is why a run whose worker's session ended is
// recovered, as its record says.
const RecoveryReasonSessionEnded = "the worker's database session ended before the turn finished"

// NextWorkerSession numbers a new worker session. Numbers are not reused
// until the sequence wraps after two billion.
func NextWorkerSession(ctx context.Context, db Executor) (int32, error) {
	var n int32
	if err := db.QueryRow(ctx, `SELECT nextval('worker_session_seq')::integer`).Scan(&n); err != nil {
		return 0, fmt.Errorf("number the worker session: %w", err)
	}
	return n, nil
}

// TakeWorkerSession takes the session's lock on the connection db, which
// must be a single connection that the worker keeps for as long as it
// lives (never a pool's: the lock belongs to one server session). It
// returns false when another connection holds the lock: the worker's
// previous one, which the server has not yet found gone. Taking a lock
// this connection holds already stacks it; take it once per connection.
func TakeWorkerSession(ctx context.Context, db Executor, session int32) (bool, error) {
	var took bool
	if err := db.QueryRow(ctx, `SELECT baton_take_worker_session($1)`, session).Scan(&took); err != nil {
		return false, fmt.Errorf("take the worker session's lock: %w", err)
	}
	return took, nil
}

// RecoverOrphanedTx recovers, in the caller's transaction, up to limit
// runs that still hold a lease but whose worker's session ended, by the
// rule of RecoverExpiredTx. Conversations another transaction holds are
// skipped (SKIP LOCKED), so every worker can run it at once and none
// recovers a run twice. It reads the server's lock table once, whatever
// the number of leases.
func RecoverOrphanedTx(ctx context.Context, tx Executor, limit, maxAttempts int) ([]Recovery, error) {
	rows, err := tx.Query(ctx, `
		SELECT c.id, c.run_id FROM conversations c JOIN agent_runs r ON r.id = c.run_id
		WHERE c.run_id IS NOT NULL AND c.lease_expires_at > now()
			AND r.worker_session IS NOT NULL
			AND r.worker_session NOT IN (SELECT baton_worker_sessions_held())
			AND baton_worker_sessions_trusted()
		ORDER BY c.lease_expires_at
		LIMIT $1
		FOR UPDATE OF c SKIP LOCKED`, limit)
	if err != nil {
		return nil, fmt.Errorf("recover: find runs of gone workers: %w", err)
	}
	type orphan struct{ conversation, run string }
	var found []orphan
	for rows.Next() {
		var o orphan
		if err := rows.Scan(&o.conversation, &o.run); err != nil {
			rows.Close()
			return nil, err
		}
		found = append(found, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recover: find runs of gone workers: %w", err)
	}
	var out []Recovery
	for _, o := range found {
		r, err := recoverRunTx(ctx, tx, o.conversation, o.run, maxAttempts, RecoveryReasonSessionEnded)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
