package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/batonhq/baton/schema"
)

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

// DeclaredTool is a Tool that presents itself to agents (StepRequest.Tools):
// its description and the JSON Schema of its arguments, against which the
// turn runner checks each call before it is journaled. A Tool that does
// not declare itself may still be called by an agent that knows it (the
// echo agent's tools).
type DeclaredTool interface {
	Tool
	Spec() ToolSpec
	// Validate checks a call's arguments. Its error is written for the
	// agent, which gets it as the call's result.
	Validate(args json.RawMessage) error
}

// ApprovalTool is a Tool whose calls may wait for a person. The journal
// asks before each call of a write: a call that needs approval is not
// sent; the turn stops and resumes once someone decided. Nothing a tool
// returns or a model says changes the answer: it is the operator's
// policy, fixed when the tool was built.
type ApprovalTool interface {
	Tool
	NeedsApproval() bool
}

// DefinedTool is a Tool with a definition it can change (an MCP
// server's): the SHA-256 of that definition is journaled with each call,
// and an approved call is sent only under the definition it was approved
// with.
type DefinedTool interface {
	Tool
	DefinitionSHA256() string
}

// KeyedTool is a Tool that derives the idempotency key of its calls
// itself, for example with the name of the server that receives it, from
// the turn's scope (TurnScope) and the call's ID. The journal stores the
// key it returns, and an approved call is sent with the key stored when
// approval was asked.
type KeyedTool interface {
	Tool
	IdempotencyKey(scope, toolCallID string) string
}

// ToolSource lists the tools of a turn when it starts, such as the tools
// of MCP servers. The set it returns is the turn's for the whole turn: a
// server that changes its list meanwhile changes the next turn's.
type ToolSource interface {
	TurnTools(ctx context.Context) (Tools, error)
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
	// ID is unique within the turn (a model's tool call ID).
	ID   string
	Tool string
	// Arguments are a JSON object, as the agent wrote them: perhaps not
	// JSON at all, which the tool's check tells the agent.
	Arguments json.RawMessage
}

// toolCallJSON is a ToolCall as a turn's kept steps hold it: the
// arguments as text, since an agent may have written them wrong.
type toolCallJSON struct {
	ID        string `json:"id"`
	Tool      string `json:"tool"`
	Arguments string `json:"arguments"`
}

func (c ToolCall) MarshalJSON() ([]byte, error) {
	return json.Marshal(toolCallJSON{ID: c.ID, Tool: c.Tool, Arguments: string(c.Arguments)})
}

func (c *ToolCall) UnmarshalJSON(b []byte) error {
	var j toolCallJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = ToolCall{ID: j.ID, Tool: j.Tool, Arguments: json.RawMessage(j.Arguments)}
	return nil
}

// ToolExecutor runs tools for an agent, journaling each call in operations:
// started before the tool runs, completed or failed after.
type ToolExecutor interface {
	Call(ctx context.Context, call ToolCall) (string, error)
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

// IdempotencyKey of a tool call in a turn's scope (TurnScope): stable for
// one call of the turn, whichever run makes it, different for any other,
// so the system a write tool changes can refuse a repeat.
func IdempotencyKey(scope, toolCallID string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + toolCallID))
	return "op_" + hex.EncodeToString(sum[:16])
}

// TurnScope is the scope of a turn's tool calls at a retry epoch: their
// idempotency keys derive from it. It holds the conversation's server key,
// unique across databases: a turn id alone is the hash of outbox ids,
// which every database numbers from 1, and a system that two deployments
// write to must never take one's call for the other's.
func TurnScope(conversationID, turnID string, epoch int) string {
	s := conversationID + "\x00" + turnID
	if epoch > 0 {
		s += "#" + strconv.Itoa(epoch)
	}
	return s
}

// ErrUnknownTool is returned for a call of a tool that is not registered.
var ErrUnknownTool = errors.New("unknown tool")

// ToolError is a tool's own failure. It goes back to the agent as the
// call's result, which it may react to; it does not fail the turn. Any
// other error of a tool ends the turn (the journal records it failed).
type ToolError struct {
	Tool string
	Err  error
}

func (e *ToolError) Error() string { return e.Tool + ": " + e.Err.Error() }
func (e *ToolError) Unwrap() error { return e.Err }

// OutcomeUnknownError is a tool's failure after its request may have
// left: a transport error, a timeout, a lost answer. For a write, the
// side effect may have happened: the turn fails visibly and the call is
// never sent again. A tool returns it instead of a failure the agent may
// react to.
type OutcomeUnknownError struct {
	Tool string
	Err  error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%s: the call was sent and its outcome is unknown: %v", e.Tool, e.Err)
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

func needsApproval(t Tool) bool {
	a, ok := t.(ApprovalTool)
	return ok && a.NeedsApproval()
}

func definitionSHA256(t Tool) string {
	if d, ok := t.(DefinedTool); ok {
		return d.DefinitionSHA256()
	}
	return ""
}

func idempotencyKey(t Tool, scope, toolCallID string) string {
	if k, ok := t.(KeyedTool); ok {
		return k.IdempotencyKey(scope, toolCallID)
	}
	return IdempotencyKey(scope, toolCallID)
}
