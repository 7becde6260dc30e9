package agent

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// Interrupt is a question an external agent stopped its step to ask a
// person: an AG-UI interrupt (a RUN_FINISHED whose outcome is
// "interrupt", or the legacy CUSTOM event on_interrupt), an AI SDK
// tool-approval-request, or an A2A task in state INPUT_REQUIRED.
type Interrupt struct {
	// ID is the agent's id of the interrupt (an AI SDK approvalId, an
	// A2A taskId); a resumed run answers it by this id.
	ID string `json:"id"`
	// Reason is the agent's word for what it waits for ("tool_approval"
	// for an AI SDK approval request, "on_interrupt" for the legacy
	// AG-UI event, "input_required" for an A2A task).
	Reason string `json:"reason"`
	// Message is what the agent says to the person, if anything.
	Message string `json:"message,omitempty"`
	// ToolCallID is the tool call the question is about, if any.
	ToolCallID string `json:"toolCallId,omitempty"`
	// Tool and Arguments are that call's tool and arguments, when the
	// step wrote the call.
	Tool      string          `json:"-"`
	Arguments json.RawMessage `json:"-"`
	// ResponseSchema is the JSON Schema of the answer the agent expects,
	// if it gave one.
	ResponseSchema json.RawMessage `json:"responseSchema,omitempty"`
	// Metadata is what the answer needs besides ID, if anything: for an
	// A2A task, "taskId" and "contextId", the task and the context that
	// the answer (a new message) goes to. Not read from an AG-UI
	// interrupt, whose own metadata is the agent's.
	Metadata map[string]string `json:"-"`
}

// InterruptError ends a step whose agent stopped to ask a person for a
// decision (see Interrupt). Baton does not yet turn an agent's question
// into an approval, so the turn fails at once: it is terminal. It
// unwraps to ErrInterrupted.
type InterruptError struct {
	// Interrupts are the questions, at least one.
	Interrupts []Interrupt
	// Step is what the step said before it stopped: its text and the
	// calls of declared tools it asked for.
	Step consumer.Step
}

func (e *InterruptError) Error() string {
	reasons := make([]string, 0, len(e.Interrupts))
	for _, in := range e.Interrupts {
		r := in.Reason
		if in.Tool != "" {
			r += " of tool " + in.Tool
		}
		reasons = append(reasons, fmt.Sprintf("%q", truncate(r, 80)))
	}
	return fmt.Sprintf("the agent stopped the step to ask a person for a decision (%d interrupt(s): %s), which Baton does not answer for external agents yet: configure the agent to run without human-in-the-loop interrupts, or keep its approvals on tools that Baton declares and runs",
		len(e.Interrupts), strings.Join(reasons, ", "))
}

// Unwrap makes errors.Is match ErrInterrupted.
func (e *InterruptError) Unwrap() error { return ErrInterrupted }

// Terminal reports that another attempt would stop at the same question.
func (e *InterruptError) Terminal() bool { return true }

// UserText is what the user reads (see consumer.TerminalError).
func (e *InterruptError) UserText() string { return userAgentInterrupt }

// FailureReason names the failure for baton_turn_failures_total.
func (e *InterruptError) FailureReason() string { return "agent_interrupt" }

// questionsOf are an agent's interrupts as the turn runner asks them.
func questionsOf(ins []Interrupt) []consumer.Question {
	out := make([]consumer.Question, len(ins))
	for i, in := range ins {
		out[i] = consumer.Question{ID: in.ID, Reason: in.Reason, Message: in.Message, ToolCallID: in.ToolCallID,
			Tool: in.Tool, Arguments: in.Arguments, ResponseSchema: in.ResponseSchema}
	}
	return out
}

// answerOf is what a person's decision on a question gives back to the
// agent: the answer when they gave one, else whether they approved.
func answerOf(q consumer.Question) json.RawMessage {
	if len(q.Answer) > 0 {
		return q.Answer
	}
	if q.Status == schema.ApprovalApproved {
		return json.RawMessage(`{"approved":true}`)
	}
	return json.RawMessage(`{"approved":false}`)
}
