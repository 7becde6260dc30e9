// Package consumer runs agent turns from the outbox stream: a durable
// JetStream consumer group whose workers gather a conversation's triggers
// in a mailbox, claim its pending outbox rows in one transaction, run the
// agent with journaled tools, and finalize the turn in one transaction
// before they acknowledge the triggers. Postgres is the arbiter of every
// step; the broker only wakes workers up.
package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/batonhq/baton/schema"
)

// Agent produces the reply of one turn. It may take minutes; it is given a
// context that ends when the turn must stop (shutdown, lost lease, deleted
// conversation) and must return soon after.
type Agent interface {
	Run(ctx context.Context, turn Turn, tools ToolExecutor) (Reply, error)
}

// Turn is what an agent answers: exactly the claimed messages, with the
// conversation's earlier messages as context.
type Turn struct {
	ConversationID string
	RunID          string
	TurnID         string
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
	// is asked for.
	MoreHistory func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error)
	// Live, when set, shows the reply while the agent writes it; the turn
	// runner sets it. A stopped turn's reply is what the agent showed
	// there, so an agent that streams shows every piece of text it
	// writes, and keeps it shown when its context ends with ErrStopped.
	Live Live
	// Tools are the tools of this turn, when a Config.ToolSource listed
	// them as the turn started; nil otherwise (the agent's own tools).
	Tools Tools
	// Resume, when set, is a turn that stopped at a call for a person's
	// approval (the agent returned Suspended) and goes on from there: the
	// agent restores Resume.State and calls that tool call again, which
	// the journal answers by the decision, without asking the model again.
	Resume *Resume
}

// Reply is an agent's answer.
type Reply struct {
	Content string
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

// Effect says whether a tool changes the world. Recovery depends on it: an
// interrupted attempt that started a write is never re-run silently.
type Effect = schema.Effect

const (
	EffectRead  = schema.EffectRead
	EffectWrite = schema.EffectWrite
)

// Tool is one versioned capability an agent may call.
type Tool interface {
	Name() string
	Version() string
	Effect() Effect
	// Call runs the tool once. A write tool should pass inv.IdempotencyKey
	// to the system it changes, so that a retry below Baton's level does
	// not repeat the effect.
	Call(ctx context.Context, inv Invocation) (string, error)
}

// Invocation is one journaled call of a tool.
type Invocation struct {
	OperationID    int64
	IdempotencyKey string
	ConversationID string
	RunID          string
	Arguments      json.RawMessage
}

// ToolCall is an agent's request to run a tool.
type ToolCall struct {
	// ID is unique within the run (a model's tool call ID).
	ID        string
	Tool      string
	Arguments json.RawMessage
}

// ToolExecutor runs tools for an agent, journaling each call in operations:
// started before the tool runs, completed or failed after.
type ToolExecutor interface {
	Call(ctx context.Context, call ToolCall) (string, error)
}

// ErrUnknownTool is returned for a call of a tool that is not registered.
var ErrUnknownTool = errors.New("unknown tool")

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
