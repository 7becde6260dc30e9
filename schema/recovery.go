package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Recovery outcomes.
const (
	// RecoveryRetry: the interrupted attempt had no operation, or only
	// reads; its rows are pending again and must be announced again.
	RecoveryRetry = "retry"
	// RecoveryFailed: the attempt had started a side-effecting operation
	// (or used its last attempt); it failed visibly and is never re-run
	// silently.
	RecoveryFailed = "failed"
	// RecoveryNone: the run had nothing left to recover; another worker
	// got there first.
	RecoveryNone = "none"
	// RecoveryStopped: the run had been asked to stop (StopTx); its turn
	// ended stopped, with an empty reply (what it had written died with
	// it), and is never retried. A run that a newer message interrupted
	// (DoubleTextingInterrupt) and that started no write gives its rows
	// back instead (RetryIDs), to be answered with the newer message.
	RecoveryStopped = "stopped"
)

// Recovery is what recovering one run did.
type Recovery struct {
	ConversationID string
	RunID          string
	TurnID         string
	Outcome        string
	// RetryIDs are rows back in pending (RecoveryRetry, or an
	// interrupted RecoveryStopped); the caller announces them in the same
	// transaction.
	RetryIDs []int64
	// FailedIDs are rows that became error (RecoveryFailed).
	FailedIDs []int64
	// ErrorMessageID is the visible error of a RecoveryFailed run.
	ErrorMessageID string
	// StoppedIDs are the rows of a RecoveryStopped run, done (or pending
	// again, in RetryIDs, when a newer message interrupted it), and
	// ReplyID its stopped reply.
	StoppedIDs []int64
	ReplyID    string
}

// RecoverExpiredTx recovers up to limit runs whose conversation lease has
// expired, in the caller's transaction. Leased conversations are locked
// with SKIP LOCKED, so every worker can run it at once and none recovers a
// run twice: a conversation another transaction holds (recovering, claiming
// or finalizing it) is left to that transaction.
func RecoverExpiredTx(ctx context.Context, tx Executor, limit, maxAttempts int) ([]Recovery, error) {
	rows, err := tx.Query(ctx, `
		SELECT id, run_id FROM conversations
		WHERE run_id IS NOT NULL AND lease_expires_at <= now()
		ORDER BY lease_expires_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED`, limit)
	if err != nil {
		return nil, fmt.Errorf("recover: find expired leases: %w", err)
	}
	type expired struct{ conversation, run string }
	var found []expired
	for rows.Next() {
		var e expired
		if err := rows.Scan(&e.conversation, &e.run); err != nil {
			rows.Close()
			return nil, err
		}
		found = append(found, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recover: find expired leases: %w", err)
	}
	var out []Recovery
	for _, e := range found {
		r, err := recoverRunTx(ctx, tx, e.conversation, e.run, maxAttempts, RecoveryReasonLeaseExpired)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// RecoverRunTx recovers one run now, whether or not its lease expired: a
// worker that shuts down gives up its own unfinished turns this way instead
// of leaving them to lease expiry. It locks the conversation and does
// nothing (RecoveryNone) when the run no longer owns it.
func RecoverRunTx(ctx context.Context, tx Executor, conversationID, runID string, maxAttempts int, reason string) (Recovery, error) {
	var owner *string
	err := tx.QueryRow(ctx, `SELECT run_id FROM conversations WHERE id = $1 FOR UPDATE`, conversationID).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return Recovery{ConversationID: conversationID, RunID: runID, Outcome: RecoveryNone}, nil
	}
	if err != nil {
		return Recovery{}, fmt.Errorf("recover: lock conversation: %w", err)
	}
	if owner == nil || *owner != runID {
		return Recovery{ConversationID: conversationID, RunID: runID, Outcome: RecoveryNone}, nil
	}
	return recoverRunTx(ctx, tx, conversationID, runID, maxAttempts, reason)
}

// Why a run is recovered, as its record says.
const (
	RecoveryReasonLeaseExpired = "lease expired before the turn finished"
	RecoveryReasonShutdown     = "the worker shut down before the turn finished"
)

// recoverRunTx applies the reference's recovery rule to a run that owns the
// conversation, whose row the caller has locked:
//
//   - no operation, only reads, or writes whose outcome is journaled:
//     rows back to pending, to be announced again; the next claim goes on
//     from the turn's journal of steps (reads are safe to repeat, and a
//     journaled write is never sent again);
//   - a write whose outcome is unknown (started, no answer journaled), or
//     any write of a run from before the journal: the attempt failed and
//     says so in the conversation; sending it again could repeat the side
//     effect, which may have happened;
//   - rows already at the attempt cap: they fail too, or a turn that kills
//     its worker every time would loop forever.
//
// A run that was asked to stop (StopTx) is settled as stopped instead,
// whatever it did: its rows are done with an empty stopped reply, and
// nothing of it runs again, a started write least of all. One that a
// newer message interrupted, and that started no write, gives its rows
// back to be answered with that message (FinalizeTx).
func recoverRunTx(ctx context.Context, tx Executor, conversationID, runID string, maxAttempts int, reason string) (Recovery, error) {
	r := Recovery{ConversationID: conversationID, RunID: runID}
	var outboxIDs []int64
	var writes []string
	var stop bool
	var generation int
	err := tx.QueryRow(ctx, `
		SELECT r.turn_id, r.outbox_ids,
			COALESCE((SELECT array_agg(o.tool ORDER BY o.id) FROM operations o WHERE o.run_id = r.id AND `+blockingWriteSQL+`), '{}'),
			EXISTS (SELECT 1 FROM conversations c WHERE c.id = $2 AND c.stop_run_id = r.id),
			(SELECT COALESCE(max(o.generation), 0) FROM agent_outbox o WHERE o.id = ANY(r.outbox_ids))
		FROM agent_runs r WHERE r.id = $1`, runID, conversationID).Scan(&r.TurnID, &outboxIDs, &writes, &stop, &generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("recover: run %s owns conversation %q but has no agent_runs row", runID, conversationID)
	}
	if err != nil {
		return r, fmt.Errorf("recover: read run: %w", err)
	}
	if stop {
		out, err := FinalizeTx(ctx, tx, Finalize{
			ConversationID: conversationID, RunID: runID, TurnID: r.TurnID, OutboxIDs: outboxIDs,
			Generation: generation, Stopped: true,
		})
		if err != nil {
			return r, fmt.Errorf("recover stopped run %s: %w", runID, err)
		}
		r.Outcome, r.StoppedIDs, r.ReplyID = RecoveryStopped, outboxIDs, out.MessageID
		if out.Interrupted {
			r.RetryIDs = outboxIDs
		}
		return r, nil
	}
	var attempts int
	if err := tx.QueryRow(ctx, `
		SELECT COALESCE(max(attempts), 0) FROM agent_outbox
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, outboxIDs, runID).Scan(&attempts); err != nil {
		return r, fmt.Errorf("recover: read attempts: %w", err)
	}
	if len(writes) == 0 && attempts < maxAttempts {
		if err := releaseTx(ctx, tx, conversationID, runID, outboxIDs, "pending", false); err != nil {
			return r, fmt.Errorf("recover run %s: %w", runID, err)
		}
		if _, err := tx.Exec(ctx, `
			UPDATE agent_runs SET status = 'recovered', error = $2, finished_at = clock_timestamp()
			WHERE id = $1`, runID, reason); err != nil {
			return r, fmt.Errorf("recover: record run: %w", err)
		}
		r.Outcome = RecoveryRetry
		r.RetryIDs = outboxIDs
		return r, nil
	}
	cause := fmt.Sprintf("%s at attempt %d, the cap: every attempt stopped without an answer", reason, attempts)
	userText := fmt.Sprintf("The assistant stopped after %d attempts without an answer. Press Retry or send your message again.", attempts)
	if len(writes) > 0 {
		cause = fmt.Sprintf("%s after the run started the write %q, which was not repeated", reason, writes[0])
		userText = startedWriteText(writes[0])
	}
	out, err := FailAttemptTx(ctx, tx, Failure{
		ConversationID: conversationID,
		RunID:          runID,
		TurnID:         r.TurnID,
		OutboxIDs:      outboxIDs,
		Reason:         cause,
		UserText:       userText,
		MaxAttempts:    maxAttempts,
		Terminal:       true,
	})
	if err != nil {
		return r, fmt.Errorf("recover run %s: %w", runID, err)
	}
	r.Outcome = RecoveryFailed
	r.FailedIDs = outboxIDs
	r.ErrorMessageID = out.ErrorMessageID
	return r, nil
}
