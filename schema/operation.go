package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Effect says whether an operation changes the world. Recovery depends on
// it: an interrupted attempt that started a write is never re-run silently.
type Effect string

const (
	EffectRead  Effect = "read"
	EffectWrite Effect = "write"
)

// Operation is one tool call of a run, as the operations journal starts it.
type Operation struct {
	RunID          string
	ConversationID string
	// TurnID, Epoch and Step place the call in its turn's journal of steps
	// (see RecordStepTx): the turn's operations, whichever run started
	// them. An empty TurnID places it in its run alone.
	TurnID string
	Epoch  int
	Step   int
	// ToolCallID is unique within the turn (a model's tool call ID, made
	// unique by the turn runner).
	ToolCallID     string
	Tool           string
	ToolVersion    string
	Effect         Effect
	IdempotencyKey string
	// Arguments is the call's JSON arguments.
	Arguments string
	// DefinitionSHA256 is the hash of the tool's definition the call was
	// made under, for a tool that has one (an MCP server's). Defaults to
	// none.
	DefinitionSHA256 string
}

// ErrDuplicateToolCall is returned when a run starts a second operation
// with the tool call ID of an earlier one.
var ErrDuplicateToolCall = errors.New("tool call id used twice in one run")

// StartOperationTx journals op as started, only while its run owns the
// conversation, and returns the operation's ID. The share lock on the
// conversation row orders it against a recovery (which locks the row for
// update): either recovery sees this started operation, or the run sees
// that it lost the lease (ErrLeaseLost, or ErrConversationDeleted) and
// runs nothing.
func StartOperationTx(ctx context.Context, tx Executor, op Operation) (int64, error) {
	id, _, err := StartOperationHashedTx(ctx, tx, op)
	return id, err
}

// StartOperationHashedTx is StartOperationTx that also returns the SHA-256
// of the arguments as the journal keeps them (see RequestApprovalTx).
//
// A read of the turn that an earlier run started and never finished (its
// worker died) is taken over by this run and started again: reads are
// safe to repeat. Any other call of the turn already journaled is
// ErrDuplicateToolCall: a write that started is never started twice.
func StartOperationHashedTx(ctx context.Context, tx Executor, op Operation) (int64, string, error) {
	var owned bool
	err := tx.QueryRow(ctx, `SELECT true FROM conversations WHERE id = $1 AND run_id = $2 FOR SHARE`, op.ConversationID, op.RunID).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", ownershipError(ctx, tx, op.ConversationID)
	}
	if err != nil {
		return 0, "", err
	}
	var id int64
	var sum string
	err = tx.QueryRow(ctx, fmt.Sprintf(`
		INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, tool_version, effect, idempotency_key, arguments,
			arguments_sha256, definition_sha256, turn_id, epoch, step)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, `+argumentsHashSQL+`, nullif($9, ''), nullif($10, ''),
			CASE WHEN $10 = '' THEN NULL ELSE $11::integer END, CASE WHEN $10 = '' THEN NULL ELSE $12::integer END)
		ON CONFLICT (conversation_id, turn_id, epoch, tool_call_id) WHERE turn_id IS NOT NULL DO UPDATE
		SET run_id = EXCLUDED.run_id, started_at = now()
		WHERE operations.status = 'started' AND operations.effect = 'read' AND EXCLUDED.effect = 'read'
		RETURNING id, arguments_sha256`, "$8"),
		op.RunID, op.ConversationID, op.ToolCallID, op.Tool, op.ToolVersion, string(op.Effect), op.IdempotencyKey, op.Arguments,
		op.DefinitionSHA256, op.TurnID, op.Epoch, op.Step).Scan(&id, &sum)
	if IsUniqueViolation(err) || errors.Is(err, pgx.ErrNoRows) {
		return 0, "", fmt.Errorf("%w: %q in run %s; give each call its own id", ErrDuplicateToolCall, op.ToolCallID, op.RunID)
	}
	return id, sum, err
}

// CompleteOperation journals a started operation as completed with its
// result.
func CompleteOperation(ctx context.Context, db Executor, id int64, result string) error {
	if _, err := db.Exec(ctx, `
		UPDATE operations SET status = 'completed', result = $2, finished_at = now() WHERE id = $1`, id, result); err != nil {
		return fmt.Errorf("journal completed operation %d: %w", id, err)
	}
	return nil
}

// UnknownOperation journals a started operation whose outcome is unknown:
// it was sent and no answer came back. A write in that state may have
// taken effect: it is never sent again, and its turn fails visibly.
func UnknownOperation(ctx context.Context, db Executor, id int64, cause string) error {
	if _, err := db.Exec(ctx, `
		UPDATE operations SET status = 'unknown', error = $2, finished_at = now() WHERE id = $1`, id, cause); err != nil {
		return fmt.Errorf("journal operation %d with its outcome unknown: %w", id, err)
	}
	return nil
}

// FailOperation journals a started operation as failed with its error.
func FailOperation(ctx context.Context, db Executor, id int64, cause string) error {
	if _, err := db.Exec(ctx, `
		UPDATE operations SET status = 'failed', error = $2, finished_at = now() WHERE id = $1`, id, cause); err != nil {
		return fmt.Errorf("journal failed operation %d: %w", id, err)
	}
	return nil
}

// RecordSideEffect appends one row to tool_side_effects: the side effect of
// the echo agent's notify tool, kept so that a repeated side effect is
// countable in tests and the kill test.
func RecordSideEffect(ctx context.Context, db Executor, operationID int64, idempotencyKey, conversationID, payload string) error {
	if _, err := db.Exec(ctx, `
		INSERT INTO tool_side_effects (operation_id, idempotency_key, conversation_id, payload)
		VALUES ($1, $2, $3, $4)`, operationID, idempotencyKey, conversationID, payload); err != nil {
		return fmt.Errorf("record side effect: %w", err)
	}
	return nil
}
