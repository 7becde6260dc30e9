// Package consumer runs agent turns from the outbox stream: a durable
// JetStream consumer group whose workers gather a conversation's triggers
// in a mailbox, claim its pending outbox rows in one transaction, run the
// turn's steps with journaled tools, and finalize the turn in one
// transaction before they acknowledge the triggers. Postgres is the
// arbiter of every step; the broker only wakes workers up.
package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/schema"
)

// Agent answers one step of a turn: it is a step provider. The turn runner
// drives the loop, the same for every agent: it asks the agent for a step,
// journals and runs the tool calls the step asks for (with their
// approvals), and asks for the next step with their results, until a step
// asks for no tool. An agent never runs a tool itself, so every side
// effect goes through the journal.
//
// A step may take minutes; its context ends when the turn must stop
// (shutdown, lost lease, a stop, deleted conversation), and the agent
// must return soon after.
type Agent interface {
	Step(ctx context.Context, req StepRequest) (Step, error)
}

// Turn is what an agent answers: exactly the claimed messages, with the
// conversation's earlier messages as context.
type Turn struct {
	// ConversationID is the conversation's server key (c_...), unique
	// across owners; never the id its owner chose.
	ConversationID string
	// Owner is the user the conversation belongs to, as Baton names
	// users (a token's user, or <issuer>|<subject> of a JWT).
	Owner  string
	RunID  string
	TurnID string
	// Epoch counts the user's explicit retries of the turn: an automatic
	// retry or a re-claim keeps it, so it posts the same steps again.
	Epoch int
	// Attempt counts attempts at these messages, this one included.
	Attempt int
	// Messages are the user messages of the turn, in order.
	Messages []schema.Message
	// History is what was said before, oldest first: the newest
	// Config.HistoryLimit messages.
	History []schema.Message
	// MoreHistory, when set, loads up to limit messages said before the
	// message whose Seq is beforeSeq, newest first, for an agent whose
	// context budget can use more than History holds. It reads only what
	// is asked for, and each page once per turn.
	MoreHistory func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error)
	// OpenFile returns the bytes of the file sum of the message whose
	// server key is messageKey (a message of Messages or of the history):
	// what an agent that sends files to its model reads.
	OpenFile func(ctx context.Context, messageKey, sum string) (schema.StoredFile, error)
	// FileLink returns a short-lived link to the file sum of the message
	// whose server key is messageKey, which works without a token (signed,
	// see schema.FileLinks), for an agent that fetches what it reads; ""
	// when the worker has no Config.FilesURL.
	FileLink func(ctx context.Context, messageKey string, f schema.File) (string, error)
}

// StepRequest is what one step of a turn is given.
type StepRequest struct {
	// Turn is the turn; the same for each of its steps.
	Turn *Turn
	// Index numbers the step within the turn, from 0.
	Index int
	// Steps are the turn's earlier steps, oldest first, each with the
	// results of its calls.
	Steps []Step
	// Tools are the tools the agent may call (those that declare
	// themselves, see DeclaredTool), sorted by name; the same for each
	// step of a turn.
	Tools []ToolSpec
	// Live shows the step's text and reasoning while the agent writes
	// them. A step that streams shows each piece; one that does not shows
	// nothing, and its text and reasoning are shown when the step returns.
	Live StepLive
}

// Key is the step's identity: the same for every post of this step of
// this turn (an automatic retry, a re-claim after a worker died), another
// after a user's explicit retry, and another in any other conversation. It
// is made of [A-Za-z0-9_] only, so any agent can take it as a run id.
func (r StepRequest) Key() string {
	return StepKey(r.Turn.ConversationID, r.Turn.TurnID, r.Turn.Epoch, r.Index)
}

// StepKey is the identity of step index of a turn of a conversation (its
// server key) at a retry epoch. A turn's id is unique only within its
// database (it derives from outbox ids, which every database numbers
// from 1): the conversation's key, unique everywhere, keeps the steps of
// two deployments that share an agent from having the same key.
func StepKey(conversation, turnID string, epoch, index int) string {
	sum := sha256.Sum256([]byte(conversation + "\x00" + turnID + "\x00" + strconv.Itoa(epoch) + "\x00" + strconv.Itoa(index)))
	return "step_" + hex.EncodeToString(sum[:16])
}

// ReplySoFar is the reply of the earlier steps: their texts, a paragraph
// each.
func (r StepRequest) ReplySoFar() string {
	var parts []string
	for _, s := range r.Steps {
		if s.Text != "" {
			parts = append(parts, s.Text)
		}
	}
	return strings.Join(parts, paragraph)
}

// StepAbandoned reports whether a step's context ended for good: the turn
// was stopped, or newer messages superseded it (they are answered in a
// turn of their own, with steps of other keys), so this step is never
// posted again. An agent whose work outlives the request (an A2A task)
// cancels it then. After any other end (a shutdown, a lost lease, the
// turn's deadline) a later attempt posts the same step again and may take
// that work up where it is.
func StepAbandoned(ctx context.Context) bool {
	cause := context.Cause(ctx)
	return ctx.Err() != nil && (errors.Is(cause, ErrStopped) || errors.Is(cause, errSuperseded))
}

// paragraph separates the texts of a turn's steps in its reply.
const paragraph = "\n\n"

// Step is an agent's answer to one step: text, tool calls for the turn
// runner to run, or both.
type Step struct {
	// Text is what the step says, whole (also when it streamed).
	Text string `json:"text,omitempty"`
	// Reasoning is what the model thought before it answered, whole (also
	// when it streamed), for agents whose model shows it. It is kept with
	// the reply and shown apart from its text; an agent never sends it
	// back to its model.
	Reasoning string `json:"reasoning,omitempty"`
	// Calls are the tools the step asks for, in order. The turn runner
	// gives each an ID unique within the turn when the agent gave none,
	// or one an earlier call has.
	Calls []ToolCall `json:"calls,omitempty"`
	// Results are the answers of Calls, one each, in order: set by the
	// turn runner, for the steps after this one.
	Results []ToolResult `json:"results,omitempty"`
	// Questions are what the agent asks a person before it goes on (an
	// AG-UI interrupt, an AI SDK tool approval request, an A2A task that
	// needs input). The turn waits for each, holding nothing, after the
	// step's calls ran; the answers go back to the agent with the next
	// step.
	Questions []Question `json:"questions,omitempty"`
	// Truncated is set when the agent stopped before the end of its
	// answer (a model that ran out of output tokens): the turn's reply is
	// the text so far, stored and shown as cut off, and Calls (perhaps
	// cut in half) do not run.
	Truncated bool `json:"truncated,omitempty"`
	// Requests counts the requests the agent made for this step, retries
	// included, for budgets that span a turn.
	Requests int `json:"requests,omitempty"`
}

// Question is what an agent asks a person mid-turn.
type Question struct {
	// ID is the agent's id of the question; its answer goes back under it.
	ID string `json:"id"`
	// Reason is the agent's word for what it waits for.
	Reason string `json:"reason,omitempty"`
	// Message is what the agent says to the person.
	Message string `json:"message,omitempty"`
	// ToolCallID, Tool and Arguments are the call the question is about,
	// when it is about one: a tool the agent runs itself and wants
	// approved.
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Tool       string          `json:"tool,omitempty"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
	// ResponseSchema is the JSON Schema of the answer the agent expects;
	// without one, the answer is a yes or a no.
	ResponseSchema json.RawMessage `json:"response_schema,omitempty"`
	// Data is what the agent's protocol needs to give the answer back
	// (an A2A task, say), kept with the question and never shown.
	Data json.RawMessage `json:"data,omitempty"`
	// Status and Answer are the person's decision, set by the turn
	// runner once it is made: approved (with the answer, if the question
	// expects one), denied, or expired.
	Status string          `json:"status,omitempty"`
	Answer json.RawMessage `json:"answer,omitempty"`
}

// ToolResult is the answer of one tool call.
type ToolResult struct {
	// Output is what the tool returned.
	Output string `json:"output,omitempty"`
	// Error, when set, says why the call failed or was not made (an
	// unknown tool, arguments that do not match its schema, the tool's
	// own failure, a person's denial): the agent may react to it.
	Error string `json:"error,omitempty"`
}

// ToolSpec is how a tool presents itself to an agent.
type ToolSpec struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Schema is the JSON Schema of the arguments, an object schema.
	Schema json.RawMessage `json:"parameters"`
}

// StepLive shows a step while an agent writes it (see StepRequest.Live).
type StepLive interface {
	// Text appends text to the step's answer.
	Text(delta string)
	// Reasoning appends text to the step's reasoning, shown apart from
	// its answer.
	Reasoning(delta string)
	// Retry voids what the step has shown so far, its reasoning
	// included: the agent tries it again.
	Retry()
}

// Reply is a turn's answer.
type Reply struct {
	Content string
	// Reasoning is the turn's reasoning: the reasoning of its steps, a
	// paragraph each, as Content holds their text. Empty when the agent
	// showed none.
	Reasoning string
	// Truncated is set when the model stopped before the end of its
	// answer (it ran out of output tokens): the reply is stored and shown
	// as cut off, never as a silent whole.
	Truncated bool
}

// RetryAfterError marks an agent error that asks for the next attempt no
// sooner than RetryAfter from now (a model server's rate limit or
// overload with Retry-After): the turn goes back to pending with that
// not-before time instead of waiting inside its lease, and the user sees
// that it is waiting for the model.
type RetryAfterError interface {
	error
	RetryAfter() time.Duration
}

// retryAfter returns the wait an error asks for, or zero.
func retryAfter(err error) time.Duration {
	var r RetryAfterError
	if errors.As(err, &r) {
		return max(r.RetryAfter(), 0)
	}
	return 0
}

// FailureReasoner is an agent error that names its kind of failure for
// the metric baton_turn_failures_total{reason}: a short snake_case word
// from a small fixed set ("rate_limited", "model_auth", ...), never text
// that varies from one error to the next.
type FailureReasoner interface {
	error
	FailureReason() string
}

// Failure reasons the turn runner knows itself; an agent error without a
// reason of its own counts as ReasonOther.
const (
	ReasonTurnTimeout = "turn_timeout"
	ReasonUnknownTool = "unknown_tool"
	ReasonSuperseded  = "write_before_superseded"
	ReasonOther       = "other"
)

// failureReason returns the metric label of a failed attempt's cause.
func failureReason(err error) string {
	var r FailureReasoner
	switch {
	case errors.Is(err, ErrTurnTimeout):
		return ReasonTurnTimeout
	case errors.Is(err, ErrUnknownTool):
		return ReasonUnknownTool
	case errors.Is(err, errSuperseded):
		return ReasonSuperseded
	case errors.As(err, &r) && validReason(r.FailureReason()):
		return r.FailureReason()
	}
	return ReasonOther
}

// validReason keeps a label short and plain: what is not becomes
// ReasonOther, so an agent cannot fill the metric with arbitrary text.
func validReason(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// TerminalError marks an agent error that another attempt cannot fix (a
// refused API key, an unknown model, an exhausted budget): the turn fails
// at once. The user reads its UserText() when it has one (a short
// explanation naming no setting or server), the operator its Error().
type TerminalError interface {
	error
	Terminal() bool
}

// IsTerminal reports whether err, or an error it wraps, is terminal.
func IsTerminal(err error) bool {
	var t TerminalError
	return errors.As(err, &t) && t.Terminal()
}

// ErrTurnTimeout ends a turn that ran past Config.TurnTimeout.
var ErrTurnTimeout = errors.New("the turn ran past its deadline")

// userText is the short explanation for the user that an agent error
// offers (a UserText() string method), or none.
func userText(cause error) string {
	var u interface{ UserText() string }
	if errors.As(cause, &u) {
		return u.UserText()
	}
	return ""
}
