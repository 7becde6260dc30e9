package schema

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Kinds of approval.
const (
	// ApprovalKindCall: a call of a tool Baton runs waits for a person's
	// approval before it is sent.
	ApprovalKindCall = "call"
	// ApprovalKindQuestion: the agent asked a person a question (an AG-UI
	// interrupt, an AI SDK tool approval request, an A2A task that needs
	// input); the answer goes back to it with the next step.
	ApprovalKindQuestion = "question"
)

// Question is what an agent asked a person mid-turn.
type Question struct {
	// ID is the agent's id of the question: its answer is given back
	// under it.
	ID string `json:"id"`
	// Reason is the agent's word for what it waits for.
	Reason string `json:"reason,omitempty"`
	// Message is what the agent says to the person.
	Message string `json:"message,omitempty"`
	// ToolCallID, Tool and Arguments are the call the question is about,
	// when it is about one (a tool the agent runs itself).
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Tool       string          `json:"tool,omitempty"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
	// ResponseSchema is the JSON Schema of the answer the agent expects;
	// without one, the answer is a yes or a no.
	ResponseSchema json.RawMessage `json:"response_schema,omitempty"`
	// Data is what the agent's protocol needs to give the answer back
	// (an A2A task, say): kept, never shown.
	Data json.RawMessage `json:"data,omitempty"`
}

// QuestionAnswer is a decided question as a re-claimed turn finds it.
type QuestionAnswer struct {
	// Status is approved (answered), denied or expired.
	Status string
	// Answer is the person's answer, when they gave one.
	Answer json.RawMessage
}

// ErrAnswerInvalid: the answer does not match the schema the agent gave,
// or a question that expects an answer got none.
var ErrAnswerInvalid = errors.New("the answer does not match what the agent asked for")

// AnswerError is ErrAnswerInvalid with why, written for the person.
type AnswerError struct{ Why string }

func (e *AnswerError) Error() string { return ErrAnswerInvalid.Error() + ": " + e.Why }
func (e *AnswerError) Unwrap() error { return ErrAnswerInvalid }

// askTx records the approval of a question: no call of Baton's waits.
func askTx(ctx context.Context, tx Executor, p ApprovalRequest, out *Requested) (int64, error) {
	q, err := json.Marshal(p.Question)
	if err != nil {
		return 0, fmt.Errorf("park: keep the question: %w", err)
	}
	args := p.Question.Arguments
	if !json.Valid(args) {
		args = json.RawMessage(`{}`)
	}
	var id int64
	if err := tx.QueryRow(ctx, fmt.Sprintf(`
		INSERT INTO approvals (public_id, conversation_id, run_id, turn_id, outbox_ids, tool, arguments,
			arguments_sha256, definition_sha256, state, expires_at, kind, epoch, step, question)
		VALUES ($1, $2, $3, $4, $5, $6, $7, `+argumentsHashSQL+`, '', $8, clock_timestamp() + make_interval(secs => $9),
			'question', $10, $11, $12)
		RETURNING id, expires_at, arguments_sha256`, "$7"),
		out.ApprovalID, p.ConversationID, p.RunID, p.TurnID, p.OutboxIDs, p.Question.Tool, args, p.State, p.TTL.Seconds(),
		p.Epoch, p.Step, q).Scan(&id, &out.ExpiresAt, &out.ArgumentsSHA256); err != nil {
		return 0, fmt.Errorf("park: record the question: %w", err)
	}
	return id, nil
}

// checkAnswer checks a person's answer to q: an answer the agent's schema
// takes, or none when the person says no. Without a schema, a yes needs
// no answer.
func checkAnswer(q *Question, d Decision) error {
	if !d.Approved {
		return nil
	}
	if len(bytes.TrimSpace(q.ResponseSchema)) == 0 {
		if len(d.Answer) > 0 && !json.Valid(d.Answer) {
			return &AnswerError{Why: "the answer is not JSON"}
		}
		return nil
	}
	if len(bytes.TrimSpace(d.Answer)) == 0 {
		return &AnswerError{Why: "this question expects an answer: send {\"answer\": ...} matching its response_schema, or {\"approved\": false} to decline"}
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(q.ResponseSchema))
	if err != nil {
		return &AnswerError{Why: "the agent's response_schema is not JSON, so no answer can match it; decline with {\"approved\": false}"}
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("baton-question:///schema.json", doc); err != nil {
		return &AnswerError{Why: "the agent's response_schema is not a schema: decline with {\"approved\": false}"}
	}
	sch, err := c.Compile("baton-question:///schema.json")
	if err != nil {
		return &AnswerError{Why: "the agent's response_schema does not compile: decline with {\"approved\": false}"}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(d.Answer))
	if err != nil {
		return &AnswerError{Why: "the answer is not JSON"}
	}
	if err := sch.Validate(inst); err != nil {
		return &AnswerError{Why: strings.Join(strings.Fields(err.Error()), " ")}
	}
	return nil
}

// loadAnswers reads the decided questions of a turn at an epoch, by step
// and question id.
func loadAnswers(ctx context.Context, db Executor, conversationID, turnID string, epoch int) (map[int]map[string]QuestionAnswer, error) {
	rows, err := db.Query(ctx, `
		SELECT a.step, a.question->>'id', a.status, a.answer FROM approvals a
		WHERE a.conversation_id = $1 AND a.turn_id = $2 AND a.epoch = $3 AND a.kind = 'question' AND a.status <> 'pending'`,
		conversationID, turnID, epoch)
	if err != nil {
		return nil, fmt.Errorf("load the turn's answers: %w", err)
	}
	defer rows.Close()
	out := map[int]map[string]QuestionAnswer{}
	for rows.Next() {
		var step int
		var id, status string
		var answer json.RawMessage
		if err := rows.Scan(&step, &id, &status, &answer); err != nil {
			return nil, fmt.Errorf("load the turn's answers: %w", err)
		}
		if out[step] == nil {
			out[step] = map[string]QuestionAnswer{}
		}
		out[step][id] = QuestionAnswer{Status: status, Answer: answer}
	}
	return out, rows.Err()
}
