package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/schema"
)

// IdempotencyKey of a tool call: stable for one call of one run, different
// for any other, so the system a write tool changes can refuse a repeat.
func IdempotencyKey(runID, toolCallID string) string {
	sum := sha256.Sum256([]byte(runID + "\x00" + toolCallID))
	return "op_" + hex.EncodeToString(sum[:16])
}

// Tools is a set of tools by name.
type Tools map[string]Tool

// Register adds tools, replacing any of the same name.
func (ts Tools) Register(tools ...Tool) Tools {
	for _, t := range tools {
		ts[t.Name()] = t
	}
	return ts
}

// journal is the ToolExecutor of one run: every call is an operations row,
// started (in a transaction fenced by the run's lease) before the tool runs
// and completed or failed after, so recovery knows whether an interrupted
// attempt may have had a side effect.
type journal struct {
	pool           *pgxpool.Pool
	tools          Tools
	conversationID string
	runID          string
	crash          *crasher
	metrics        *metrics
}

func (j *journal) Call(ctx context.Context, call ToolCall) (string, error) {
	tool, ok := j.tools[call.Tool]
	if !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownTool, call.Tool)
	}
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	inv := Invocation{
		IdempotencyKey: IdempotencyKey(j.runID, call.ID),
		ConversationID: j.conversationID,
		RunID:          j.runID,
		Arguments:      args,
	}
	var err error
	inv.OperationID, err = j.start(ctx, call, tool, inv)
	if err != nil {
		return "", err
	}
	result, callErr := tool.Call(ctx, inv)
	// The outcome is journaled even when the turn's context ended: a
	// completed write must show as completed to recovery.
	finishCtx := context.WithoutCancel(ctx)
	if callErr != nil {
		if _, err := j.pool.Exec(finishCtx, `
			UPDATE operations SET status = 'failed', error = $2, finished_at = now() WHERE id = $1`,
			inv.OperationID, callErr.Error()); err != nil {
			return "", fmt.Errorf("journal failed operation %d: %w", inv.OperationID, err)
		}
		j.metrics.operations.WithLabelValues(call.Tool, "failed").Inc()
		return "", callErr
	}
	if _, err := j.pool.Exec(finishCtx, `
		UPDATE operations SET status = 'completed', result = $2, finished_at = now() WHERE id = $1`,
		inv.OperationID, result); err != nil {
		return "", fmt.Errorf("journal completed operation %d: %w", inv.OperationID, err)
	}
	j.metrics.operations.WithLabelValues(call.Tool, "completed").Inc()
	j.crash.at(CrashAfterTool)
	return result, nil
}

// start journals a call as started, only while the run owns the
// conversation. The share lock on the conversation row orders it against a
// recovery (which locks the row for update): either recovery sees this
// started operation, or this run sees that it lost the lease and runs
// nothing.
func (j *journal) start(ctx context.Context, call ToolCall, tool Tool, inv Invocation) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		var owned bool
		err := tx.QueryRow(ctx, `SELECT true FROM conversations WHERE id = $1 AND run_id = $2 FOR SHARE`, j.conversationID, j.runID).Scan(&owned)
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM conversations WHERE id = $1)`, j.conversationID).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				return schema.ErrConversationDeleted
			}
			return schema.ErrLeaseLost
		}
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `
			INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, tool_version, effect, idempotency_key, arguments)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			RETURNING id`,
			j.runID, j.conversationID, call.ID, tool.Name(), tool.Version(), string(tool.Effect()), inv.IdempotencyKey, string(inv.Arguments)).Scan(&id)
		if schema.IsUniqueViolation(err) {
			return fmt.Errorf("tool call id %q was used twice in run %s: give each call its own id", call.ID, j.runID)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("journal operation %s (%s): %w", call.ID, call.Tool, err)
	}
	return id, nil
}
