package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Finalize is the end of a successful turn.
type Finalize struct {
	ConversationID string
	RunID          string
	TurnID         string
	OutboxIDs      []int64
	// Generation is the claim's (Claim.Generation): the reply's ID is
	// ReplyID(OutboxIDs, Generation).
	Generation int
	// Content of the assistant reply.
	Content string
	// Truncated marks a reply the model cut off.
	Truncated bool
	// Stopped marks a reply that a stop ended: Content is what the run had
	// written by then. A run that was asked to stop (StopTx) is finalized
	// as stopped whatever this says, and never superseded.
	Stopped bool
	// SupersedeIfNewer hands the turn back instead (SupersedeTx) when a
	// newer message of the conversation is pending and the run started
	// no write: the next turn answers them together.
	SupersedeIfNewer bool
}

// Finalized says what FinalizeTx committed.
type Finalized struct {
	// MessageID is the reply's ID, derived from the turn.
	MessageID string
	// Operations is how many of the run's operations were attached to it.
	Operations int64
	// Superseded is set when, instead of the reply, the turn was handed
	// back for a newer message (Finalize.SupersedeIfNewer).
	Superseded bool
	// Stopped is set when the reply was committed as stopped: asked for
	// (Finalize.Stopped) or because the run had been asked to stop.
	Stopped bool
}

// FinalizeTx ends a turn in the caller's transaction, all or nothing: the
// assistant reply (ID derived from the turn, so a redelivered trigger can
// never add a second one), the run's operations attached to it by run ID,
// the claimed rows done, the conversation's ordering and unread metadata,
// the lease released and the run recorded as finalized.
//
// It commits only while the run still owns the conversation (fencing):
// otherwise ErrLeaseLost, and the caller rolls back. A conversation deleted
// mid-turn fails the reply's foreign key: ErrConversationDeleted, which is a
// cancellation.
func FinalizeTx(ctx context.Context, tx Executor, f Finalize) (Finalized, error) {
	if !f.Stopped {
		var err error
		if f.Stopped, err = stopRequested(ctx, tx, f.ConversationID, f.RunID); err != nil {
			return Finalized{}, err
		}
	}
	if f.SupersedeIfNewer && !f.Stopped {
		superseded, err := SupersedeTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, true)
		if err != nil || superseded {
			return Finalized{Superseded: superseded}, err
		}
	}
	out := Finalized{MessageID: ReplyID(f.OutboxIDs, f.Generation), Stopped: f.Stopped}
	// The reply goes first, as the reference has it: its foreign key is
	// what notices a deleted conversation, and it takes the key-share lock
	// that keeps the conversation from being deleted until commit.
	if _, err := tx.Exec(ctx, `
		INSERT INTO messages (id, conversation_id, role, content, truncated, stopped, run_id, turn_id)
		VALUES ($1, $2, 'assistant', $3, $4, $5, $6, $7)`,
		out.MessageID, f.ConversationID, f.Content, f.Truncated, f.Stopped, f.RunID, f.TurnID); err != nil {
		switch {
		case IsForeignKeyViolation(err):
			return Finalized{}, ErrConversationDeleted
		case IsUniqueViolation(err):
			// Only a finalize of the same turn can have written this ID,
			// and that one released the rows: this run lost them.
			return Finalized{}, fmt.Errorf("%w: turn %s already has its reply", ErrLeaseLost, f.TurnID)
		}
		return Finalized{}, fmt.Errorf("finalize: insert reply: %w", err)
	}
	if err := releaseTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, "done", true); err != nil {
		return Finalized{}, err
	}
	tag, err := tx.Exec(ctx, `
		UPDATE operations p SET message_id = $1, `+notSentSQL+`
		FROM (SELECT $2::text AS run_id, $3::text AS conversation_id, $4::text AS turn_id) req
		WHERE p.message_id IS NULL AND (p.run_id = req.run_id OR p.run_id IN (`+stoppedRunsSQL+`))`,
		out.MessageID, f.RunID, f.ConversationID, f.TurnID)
	if err != nil {
		return Finalized{}, fmt.Errorf("finalize: attach operations: %w", err)
	}
	out.Operations = tag.RowsAffected()
	if _, err := tx.Exec(ctx, `
		UPDATE agent_runs SET status = 'finalized', reply_message_id = $2, finished_at = clock_timestamp()
		WHERE id = $1`, f.RunID, out.MessageID); err != nil {
		return Finalized{}, fmt.Errorf("finalize: record run: %w", err)
	}
	return out, nil
}

// stopRequested locks the conversation and reports whether the run that
// holds it was asked to stop (StopTx): read under the lock, a stop
// committed before it is seen.
func stopRequested(ctx context.Context, tx Executor, conversationID, runID string) (bool, error) {
	var stop bool
	err := tx.QueryRow(ctx, `
		SELECT coalesce(stop_run_id = run_id, false) FROM conversations WHERE id = $1 AND run_id = $2 FOR NO KEY UPDATE`,
		conversationID, runID).Scan(&stop)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ownershipError(ctx, tx, conversationID)
	}
	if err != nil {
		return false, fmt.Errorf("finalize: read the run's stop: %w", err)
	}
	return stop, nil
}

// stoppedRunsSQL selects the runs of the turn req.turn_id in
// req.conversation_id that stopped for an approval: the turn's reply
// carries their operations too.
const stoppedRunsSQL = `SELECT a.run_id FROM approvals a WHERE a.conversation_id = req.conversation_id AND a.turn_id = req.turn_id`

// notSentSQL settles, as the reply takes them, the calls of the turn that
// still wait for approval: the turn ended without sending them (it was
// stopped before the approved call left), and nothing sends them later.
const notSentSQL = `status = CASE WHEN p.status = 'awaiting_approval' THEN 'denied' ELSE p.status END,
	error = CASE WHEN p.status = 'awaiting_approval' THEN 'not sent: its turn ended first' ELSE p.error END,
	finished_at = CASE WHEN p.status = 'awaiting_approval' THEN now() ELSE p.finished_at END`

// releaseTx releases a run's conversation and moves its claimed rows to
// status, fenced by the run ID: when the conversation is no longer owned by
// runID, or any row is no longer processing for it, nothing must commit.
// With touch, the conversation's ordering and unread metadata count a new
// visible message.
func releaseTx(ctx context.Context, tx Executor, conversationID, runID string, outboxIDs []int64, status string, touch bool) error {
	q := `UPDATE conversations SET run_id = NULL, lease_expires_at = NULL`
	if status == "done" || status == "error" {
		// The turn ended: a later claim starts a new one, whatever
		// approval this one resumed from.
		q += `, approval_id = NULL`
	}
	if touch {
		q += `, updated_at = now(), last_message_at = now(), unread_count = unread_count + 1`
	}
	tag, err := tx.Exec(ctx, q+` WHERE id = $1 AND run_id = $2`, conversationID, runID)
	if err != nil {
		return fmt.Errorf("release conversation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ownershipError(ctx, tx, conversationID)
	}
	processedAt := "NULL"
	if status == "done" || status == "error" {
		processedAt = "now()"
	}
	tag, err = tx.Exec(ctx, `
		UPDATE agent_outbox SET status = $3, processed_at = `+processedAt+`
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, outboxIDs, runID, status)
	if err != nil {
		return fmt.Errorf("mark rows %s: %w", status, err)
	}
	if tag.RowsAffected() != int64(len(outboxIDs)) {
		return fmt.Errorf("%w: %d of %d claimed rows are still processing for run %s", ErrLeaseLost, tag.RowsAffected(), len(outboxIDs), runID)
	}
	return nil
}

// Failure is a failed attempt at a turn.
type Failure struct {
	ConversationID string
	RunID          string
	TurnID         string
	OutboxIDs      []int64
	// Reason is the operator's account of the failure: recorded on the
	// run, and as the error message's detail when the turn gives up. It
	// may name settings and servers, so the user never sees it.
	Reason string
	// UserText, when set, is a short explanation for the user of why the
	// turn failed (it must name no setting, server or secret). Defaults to
	// none: the user reads that the assistant could not answer.
	UserText string
	// MaxAttempts caps automatic attempts.
	MaxAttempts int
	// Terminal gives up at once, whatever the attempts: a side effect has
	// happened and repeating the turn could repeat it.
	Terminal bool
	// NotBefore, when positive, is how long the next attempt must wait
	// (the model server's Retry-After): under the cap the rows go back to
	// pending and the conversation may not be claimed before then.
	NotBefore time.Duration
}

// FailOutcome says what FailAttemptTx committed.
type FailOutcome struct {
	// GaveUp is true when the rows became error and a visible error message
	// was written (ErrorMessageID); false when they went back to pending.
	GaveUp         bool
	ErrorMessageID string
	// RetryIDs are rows back in pending, which the caller announces again
	// in the same transaction.
	RetryIDs []int64
	Attempts int
	// NotBefore is when the next attempt may start, when the failure
	// asked to wait; zero otherwise.
	NotBefore time.Time
}

// FailAttemptTx records a failed attempt in the caller's transaction, fenced
// like FinalizeTx. Under the attempt cap the rows go back to pending for the
// caller to announce again; at the cap (or when Terminal) a visible error
// message joins the conversation, the run's operations are attached to it,
// and the rows become error. Nothing is deleted.
func FailAttemptTx(ctx context.Context, tx Executor, f Failure) (FailOutcome, error) {
	var out FailOutcome
	var writes []string
	if err := tx.QueryRow(ctx, `
		SELECT (SELECT COALESCE(max(attempts), 0) FROM agent_outbox WHERE id = ANY($1)),
			COALESCE((SELECT array_agg(tool ORDER BY id) FROM operations WHERE run_id = $2 AND effect = 'write'), '{}')`,
		f.OutboxIDs, f.RunID).Scan(&out.Attempts, &writes); err != nil {
		return out, fmt.Errorf("fail attempt: read attempts: %w", err)
	}
	if !f.Terminal && len(writes) > 0 {
		// A write started in this attempt, and may have taken effect even
		// if it reported a failure: another attempt could repeat it.
		f.Terminal = true
		f.UserText = startedWriteText(writes[0])
		f.Reason = fmt.Sprintf("failed after starting the write %q, which was not repeated: %s", writes[0], f.Reason)
	}
	if !f.Terminal && out.Attempts < f.MaxAttempts {
		if err := releaseTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, "pending", false); err != nil {
			return out, err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE agent_runs SET status = 'failed', error = $2, finished_at = clock_timestamp() WHERE id = $1`,
			f.RunID, f.Reason); err != nil {
			return out, fmt.Errorf("fail attempt: record run: %w", err)
		}
		if f.NotBefore > 0 {
			if err := tx.QueryRow(ctx, `
				UPDATE conversations SET not_before = clock_timestamp() + make_interval(secs => $2)
				WHERE id = $1 RETURNING not_before`, f.ConversationID, f.NotBefore.Seconds()).Scan(&out.NotBefore); err != nil {
				return out, fmt.Errorf("fail attempt: record the wait: %w", err)
			}
		}
		out.RetryIDs = f.OutboxIDs
		return out, nil
	}
	out.GaveUp = true
	out.ErrorMessageID = ErrorMessageID(f.RunID)
	content := failureText(f, out.Attempts)
	if _, err := tx.Exec(ctx, `
		INSERT INTO messages (id, conversation_id, role, content, detail, run_id, turn_id)
		VALUES ($1, $2, 'error', $3, $4, $5, $6)`,
		out.ErrorMessageID, f.ConversationID, content, f.Reason, f.RunID, f.TurnID); err != nil {
		switch {
		case IsForeignKeyViolation(err):
			return out, ErrConversationDeleted
		case IsUniqueViolation(err):
			return out, fmt.Errorf("%w: run %s already has its error", ErrLeaseLost, f.RunID)
		}
		return out, fmt.Errorf("fail attempt: insert error message: %w", err)
	}
	if err := releaseTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, "error", true); err != nil {
		return out, err
	}
	if _, err := tx.Exec(ctx, `UPDATE operations SET message_id = $1 WHERE run_id = $2 AND message_id IS NULL`, out.ErrorMessageID, f.RunID); err != nil {
		return out, fmt.Errorf("fail attempt: attach operations: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE agent_runs SET status = 'failed', error = $2, reply_message_id = $3, finished_at = clock_timestamp() WHERE id = $1`,
		f.RunID, f.Reason, out.ErrorMessageID); err != nil {
		return out, fmt.Errorf("fail attempt: record run: %w", err)
	}
	return out, nil
}

// startedWriteText tells the user that an action may have happened and was
// not repeated.
func startedWriteText(tool string) string {
	return fmt.Sprintf("The assistant stopped after starting the action %q, which may have taken effect; it was not repeated. Check its result, then press Retry or send your message again if needed.", tool)
}

// failureText is what the user reads about a turn that gave up: short,
// with the run as a reference an operator can look up (the run's error,
// the error message's detail, the logs), and nothing of the cause that
// could name a setting, a server or a secret.
func failureText(f Failure, attempts int) string {
	text := f.UserText
	switch {
	case text != "":
	case f.Terminal:
		text = "The assistant could not answer this message. Press Retry or send your message again."
	default:
		text = fmt.Sprintf("The assistant could not answer after %d attempts. Press Retry or send your message again.", attempts)
	}
	return text + " (Reference: " + f.RunID + ")"
}
