package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The journal of a turn's steps (agent_steps). The turn runner asks an
// agent for a step at a time; a step that asks for tools is journaled,
// under its turn and retry epoch, before any of its calls is sent, and its
// calls' operations carry the turn, epoch and step. A re-claim of the turn
// reads the journal (LoadSteps) and goes on at the first step with no
// answer: an answered step is never asked again, and a call whose outcome
// is journaled is never sent again.

// StepRecord is one journaled step of a turn.
type StepRecord struct {
	// Step numbers the step in its turn, from 0.
	Step int
	// Answer is the agent's answer as the turn runner journaled it.
	Answer json.RawMessage
	// Operations are the step's calls that were journaled, by tool call
	// ID.
	Operations map[string]StepOperation
	// Answers are the step's questions that a person decided, by the
	// agent's question id.
	Answers map[string]QuestionAnswer
}

// StepOperation is a journaled call of a step, as a re-claimed turn finds
// it.
type StepOperation struct {
	ID         int64
	ToolCallID string
	Tool       string
	Effect     Effect
	// Status is started, completed, failed, unknown, awaiting_approval or
	// denied.
	Status string
	Result string
	Error  string
}

// StepParams journal one step's answer for a run that owns the
// conversation.
type StepParams struct {
	ConversationID string
	RunID          string
	TurnID         string
	Epoch          int
	Step           int
	Answer         json.RawMessage
}

// ErrStepJournaled: the step already has an answer in the journal, which
// stands; the caller goes on with that one.
var ErrStepJournaled = errors.New("the step already has its answer in the journal")

// RecordStepTx journals a step's answer, only while its run owns the
// conversation (the share lock on the conversation row orders it against a
// recovery, as StartOperationTx's does). A step that already has an answer
// keeps it: ErrStepJournaled.
func RecordStepTx(ctx context.Context, tx Executor, p StepParams) error {
	var owned bool
	err := tx.QueryRow(ctx, `SELECT true FROM conversations WHERE id = $1 AND run_id = $2 FOR SHARE`, p.ConversationID, p.RunID).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return ownershipError(ctx, tx, p.ConversationID)
	}
	if err != nil {
		return fmt.Errorf("journal step %d: %w", p.Step, err)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO agent_steps (conversation_id, turn_id, epoch, step, run_id, answer)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT DO NOTHING`, p.ConversationID, p.TurnID, p.Epoch, p.Step, p.RunID, p.Answer)
	if err != nil {
		return fmt.Errorf("journal step %d: %w", p.Step, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrStepJournaled
	}
	// The turn's rows belong to its journal now: should they be pending
	// again before the turn ends, the next claim takes exactly them.
	if _, err := tx.Exec(ctx, `
		UPDATE agent_outbox SET steps_turn_id = $3
		WHERE conversation_id = $1 AND run_id = $2 AND status = 'processing' AND steps_turn_id IS DISTINCT FROM $3`,
		p.ConversationID, p.RunID, p.TurnID); err != nil {
		return fmt.Errorf("journal step %d: mark the turn's rows: %w", p.Step, err)
	}
	return nil
}

// RecordStep is RecordStepTx in a transaction of its own.
func RecordStep(ctx context.Context, db Beginner, p StepParams) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return RecordStepTx(ctx, tx, p) })
}

// LoadSteps reads the journaled steps of a turn at an epoch, in order,
// with their calls' operations.
func LoadSteps(ctx context.Context, db Executor, conversationID, turnID string, epoch int) ([]StepRecord, error) {
	rows, err := db.Query(ctx, `
		SELECT s.step, s.answer, o.id, o.tool_call_id, o.tool, o.effect, o.status, coalesce(o.result, ''), coalesce(o.error, '')
		FROM agent_steps s
		LEFT JOIN operations o ON o.conversation_id = s.conversation_id AND o.turn_id = s.turn_id AND o.epoch = s.epoch AND o.step = s.step
		WHERE s.conversation_id = $1 AND s.turn_id = $2 AND s.epoch = $3
		ORDER BY s.step, o.id`, conversationID, turnID, epoch)
	if err != nil {
		return nil, fmt.Errorf("load the turn's steps: %w", err)
	}
	defer rows.Close()
	var out []StepRecord
	for rows.Next() {
		var step int
		var answer json.RawMessage
		var id *int64
		var callID, tool, effect, status *string
		var result, cause string
		if err := rows.Scan(&step, &answer, &id, &callID, &tool, &effect, &status, &result, &cause); err != nil {
			return nil, fmt.Errorf("load the turn's steps: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Step != step {
			out = append(out, StepRecord{Step: step, Answer: answer, Operations: map[string]StepOperation{}})
		}
		if id != nil {
			out[len(out)-1].Operations[*callID] = StepOperation{ID: *id, ToolCallID: *callID, Tool: *tool, Effect: Effect(*effect),
				Status: *status, Result: result, Error: cause}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load the turn's steps: %w", err)
	}
	answers, err := loadAnswers(ctx, db, conversationID, turnID, epoch)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Answers = answers[out[i].Step]
	}
	return out, nil
}

// blockingWriteSQL is true for an operation o that makes its turn
// unrepeatable: a write whose outcome is unknown (sent, no answer
// journaled), or any write of a run from before the journal of steps,
// whose turn cannot go on from where it stopped. A write whose outcome is
// journaled (completed, or failed with an answer) no longer blocks: the
// turn goes on from its journal and never sends it again.
const blockingWriteSQL = `(o.effect = 'write' AND (o.status IN ('started', 'unknown') OR o.turn_id IS NULL) AND o.status NOT IN ('awaiting_approval', 'denied'))`
