package agent

import (
	"encoding/json"

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
}

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
