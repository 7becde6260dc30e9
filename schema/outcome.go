package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// An operator's account of a write whose outcome is unknown. A write that
// was sent and never answered (operations in status started or unknown)
// is never sent again, and fails its turn visibly (invariant 15). Someone
// who can look at the system it changed can say what became of it: "it
// was done", with its result, or "it was not done". RecordOutcomeTx
// journals that as the call's outcome, and ResumeTurnTx puts the turn's
// rows back to pending as they were: the next claim takes exactly that
// turn, which goes on from its journal (consumer/replay.go) with the
// recorded outcome as the call's answer, without sending it again.

// ErrOutcomeKnown: the operation's outcome is in the journal already, or
// it is no write: there is nothing for an operator to record.
var ErrOutcomeKnown = errors.New("the call's outcome is known")

// ErrOutcomeUnknown: a write of the turn has no known outcome; the turn
// cannot go on from its journal until an operator records one.
var ErrOutcomeUnknown = errors.New("a write of the turn has no known outcome: record what became of it first")

// Outcome is what an operator says became of a write.
type Outcome struct {
	// ConversationKey and OperationID name the call.
	ConversationKey string
	OperationID     int64
	// Done: "it was done", and Result is what it returned, as the agent
	// will read it. Not done: "it was not done", and the agent reads that
	// the call failed.
	Done   bool
	Result string
	// Operator is who says so.
	Operator string
}

// RecordOutcomeTx journals what became of a write whose outcome was
// unknown, in the caller's transaction. The conversation must be free (no
// run holds it: nobody is sending the call), and the call a write in
// status started or unknown; otherwise ErrConversationBusy or
// ErrOutcomeKnown. It returns the operation as it is now.
func RecordOutcomeTx(ctx context.Context, tx Executor, o Outcome) (OperationRow, error) {
	var held bool
	err := tx.QueryRow(ctx, `SELECT run_id IS NOT NULL FROM conversations WHERE id = $1 FOR NO KEY UPDATE`, o.ConversationKey).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		return OperationRow{}, ErrNotFound
	}
	if err != nil {
		return OperationRow{}, fmt.Errorf("record outcome: %w", err)
	}
	if held {
		return OperationRow{}, fmt.Errorf("%w: a run holds it; wait for the turn to end", ErrConversationBusy)
	}
	ops, err := readOperations(ctx, tx, `o.id = $1 AND o.conversation_id = $2`, o.OperationID, o.ConversationKey)
	if err != nil {
		return OperationRow{}, err
	}
	if len(ops) == 0 {
		return OperationRow{}, ErrNotFound
	}
	if !ops[0].OutcomeUnknown() {
		return ops[0], fmt.Errorf("%w: call %s of %s is a %s in status %s", ErrOutcomeKnown, ops[0].ToolCallID, ops[0].Tool, ops[0].Effect, ops[0].Status)
	}
	cause := ops[0].Error
	if cause == "" {
		cause = "the call was sent and no answer came back"
	}
	if o.Done {
		_, err = tx.Exec(ctx, `
			UPDATE operations SET status = 'completed', result = $2, finished_at = now(), outcome_recorded_by = $3,
			       error = $4
			WHERE id = $1`, o.OperationID, o.Result, o.Operator, fmt.Sprintf("%s; %s recorded that it was done", cause, o.Operator))
	} else {
		_, err = tx.Exec(ctx, `
			UPDATE operations SET status = 'failed', finished_at = now(), outcome_recorded_by = $2, error = $3
			WHERE id = $1`, o.OperationID, o.Operator,
			fmt.Sprintf("%s: it was not done (%s; recorded by %s)", ops[0].Tool, cause, o.Operator))
	}
	if err != nil {
		return OperationRow{}, fmt.Errorf("record outcome: %w", err)
	}
	ops, err = readOperations(ctx, tx, `o.id = $1`, o.OperationID)
	if err != nil || len(ops) == 0 {
		return OperationRow{}, err
	}
	return ops[0], nil
}

// ResumeResult says what ResumeTurnTx put back.
type ResumeResult struct {
	TurnID string
	// OutboxIDs are the rows back in pending, for the caller to announce.
	OutboxIDs []int64
}

// ResumeTurnTx puts the failed rows of the conversation's newest
// journaled turn back to pending with a fresh attempt budget, keeping
// their retry epoch and their turn: the next claim takes exactly them,
// and the turn goes on from its journal (unlike a user's retry,
// RetryFailedTx, which starts the steps over in a new epoch). A write of
// the turn whose outcome is still unknown is ErrOutcomeUnknown; a
// conversation without a failed journaled turn ErrNotFound, one a run
// holds ErrConversationBusy. The caller announces the rows in the same
// transaction (AnnounceTx). The visible error messages stay.
func ResumeTurnTx(ctx context.Context, tx Executor, conversationKey string) (ResumeResult, error) {
	var res ResumeResult
	var held bool
	err := tx.QueryRow(ctx, `SELECT run_id IS NOT NULL FROM conversations WHERE id = $1 FOR NO KEY UPDATE`, conversationKey).Scan(&held)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, ErrNotFound
	}
	if err != nil {
		return res, fmt.Errorf("resume turn: %w", err)
	}
	if held {
		return res, fmt.Errorf("%w: a run holds it", ErrConversationBusy)
	}
	var epoch int
	err = tx.QueryRow(ctx, `
		SELECT steps_turn_id, epoch FROM agent_outbox
		WHERE conversation_id = $1 AND status = 'error' AND steps_turn_id IS NOT NULL
		ORDER BY id DESC LIMIT 1`, conversationKey).Scan(&res.TurnID, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("%w: conversation %s has no failed turn with a journal", ErrNotFound, conversationKey)
	}
	if err != nil {
		return res, fmt.Errorf("resume turn: %w", err)
	}
	var unknown []string
	if err := tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(o.tool || ' (call ' || o.tool_call_id || ')' ORDER BY o.id), '{}') FROM operations o
		WHERE o.conversation_id = $1 AND o.turn_id = $2 AND o.epoch = $3
		  AND o.effect = 'write' AND o.status IN ('started', 'unknown')`,
		conversationKey, res.TurnID, epoch).Scan(&unknown); err != nil {
		return res, fmt.Errorf("resume turn: %w", err)
	}
	if len(unknown) > 0 {
		return res, fmt.Errorf("%w: %v", ErrOutcomeUnknown, unknown)
	}
	rows, err := tx.Query(ctx, `
		UPDATE agent_outbox SET status = 'pending', attempts = 0, processed_at = NULL, run_id = NULL, announced_at = now()
		WHERE conversation_id = $1 AND status = 'error' AND steps_turn_id = $2 AND epoch = $3
		RETURNING id`, conversationKey, res.TurnID, epoch)
	if err != nil {
		return res, fmt.Errorf("resume turn: %w", err)
	}
	res.OutboxIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return res, fmt.Errorf("resume turn: %w", err)
	}
	return res, nil
}
