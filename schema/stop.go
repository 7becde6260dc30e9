package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrStopRequested: the run was asked to stop (StopTx). It ends stopped:
// its reply is what it wrote until then, marked stopped, and its turn is
// never retried or handed back.
var ErrStopRequested = errors.New("the run was asked to stop")

// Stop says what StopTx committed.
type Stop struct {
	// ConversationKey is the server's key of the conversation.
	ConversationKey string
	// RunID is the run that held the conversation and is now asked to
	// stop; empty when no run held it. The run ends its turn stopped on
	// its own (the worker that holds it, told at once, or else at its
	// next lease renewal or finalize, or recovery when it died).
	RunID string
	// SettledIDs are the outbox rows that waited for a turn and were
	// settled (done, stopped_at set): no turn answers them.
	SettledIDs []int64
	// Approval, when set, is the approval the stopped turn waited for
	// (no run held the conversation): its call is never sent. It was
	// pending, and the stop denied it (Denied), or decided and not yet
	// resumed (its status stays).
	Approval *Approval
	Denied   bool
}

// StopTx stops ownerID's conversation in the caller's transaction: the run
// that holds it, if any, is asked to stop (recorded on the conversation
// row, where its renewal, finalize and recovery read it), and the messages
// that wait for a turn are settled as stopped. Messages stored after the
// commit start a new turn. Stopping a conversation with nothing to stop
// changes nothing. A conversation the owner does not have is ErrNotFound.
//
// A turn that waits for an approval holds no run: its approval is denied
// and its call recorded as never sent (Stop.Approval), and its rows are
// settled with the others.
//
// The conversation row is locked first, as the producer (InsertMessageTx)
// and a claim lock it: a message is either stored before the stop, and
// stopped with it, or after, and answered.
func StopTx(ctx context.Context, tx Executor, ownerID int64, conversationID string) (Stop, error) {
	var s Stop
	var runID *string
	var approvalID *int64
	err := tx.QueryRow(ctx, `
		SELECT id, run_id, approval_id FROM conversations WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`,
		ownerID, conversationID).Scan(&s.ConversationKey, &runID, &approvalID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Stop{}, ErrNotFound
	}
	if err != nil {
		return Stop{}, fmt.Errorf("stop: lock conversation: %w", err)
	}
	if runID != nil {
		s.RunID = *runID
		// A stop outranks an interrupt (DoubleTextingInterrupt) that came
		// before it: the stopped turn's messages are never answered again.
		if _, err := tx.Exec(ctx, `UPDATE conversations SET stop_run_id = run_id, interrupted_run_id = NULL WHERE id = $1`, s.ConversationKey); err != nil {
			return Stop{}, fmt.Errorf("stop: ask the run to stop: %w", err)
		}
	}
	if runID == nil && approvalID != nil {
		// The turn waits for an approval, or to resume from one: nothing
		// of it may run later. A run that holds the conversation was
		// asked to stop above, and settles its own call.
		a, denied, err := settleApprovalTx(ctx, tx, *approvalID, ownerID)
		if err != nil {
			return Stop{}, err
		}
		s.Approval, s.Denied = a, denied
	}
	rows, err := tx.Query(ctx, `
		UPDATE agent_outbox SET status = 'done', processed_at = now(), stopped_at = now()
		WHERE conversation_id = $1 AND status = 'pending'
		RETURNING id`, s.ConversationKey)
	if err != nil {
		return Stop{}, fmt.Errorf("stop: settle waiting messages: %w", err)
	}
	if s.SettledIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		return Stop{}, fmt.Errorf("stop: settle waiting messages: %w", err)
	}
	if len(s.SettledIDs) > 0 {
		// A wait the model server asked for has nothing left to wait for.
		if _, err := tx.Exec(ctx, `UPDATE conversations SET not_before = NULL WHERE id = $1`, s.ConversationKey); err != nil {
			return Stop{}, fmt.Errorf("stop: end the wait: %w", err)
		}
	}
	return s, nil
}

// settleApprovalTx denies, for a stop, the approval a conversation's turn
// waits for, and records its call as never sent. A decided approval whose
// turn has not resumed yet keeps its status, and its call is not sent
// either: the stop settles the turn's rows, and the claim that would have
// resumed it finds them done and forgets the approval. It returns the
// approval, or nil when the conversation names none that exists, and
// whether the stop denied it.
func settleApprovalTx(ctx context.Context, tx Executor, approvalID, ownerID int64) (*Approval, bool, error) {
	var operationID int64
	a, err := scanApprovalWith(tx.QueryRow(ctx, `
		SELECT coalesce(a.operation_id, 0), `+approvalColumns+` FROM approvals a WHERE a.id = $1 FOR UPDATE OF a`, approvalID), &operationID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("stop: read the approval: %w", err)
	}
	// An approval past its time that no claim expired yet is denied here
	// as well: the stop decides it first.
	err = tx.QueryRow(ctx, `
		UPDATE approvals SET status = 'denied', decided_at = now(), decided_by = $2 WHERE id = $1 AND status = 'pending'
		RETURNING status, decided_at`, approvalID, ownerID).Scan(&a.Status, &a.DecidedAt)
	denied := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("stop: deny the approval: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE operations SET status = 'denied', error = 'not sent: the turn was stopped', finished_at = now()
		WHERE id = $1 AND status = 'awaiting_approval'`, operationID); err != nil {
		return nil, false, fmt.Errorf("stop: record the call not sent: %w", err)
	}
	return &a, denied, nil
}
