package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/batonhq/baton/consumer"
)

// Effects of a tool. Recovery depends on them: an interrupted attempt that
// started a Write is failed visibly, never re-run.
const (
	Read  = consumer.EffectRead
	Write = consumer.EffectWrite
)

// Invocation is what a tool handler receives: the arguments, already
// validated against the tool's schema, and for a write tool the
// idempotency key to pass on to the system it changes.
type Invocation = consumer.Invocation

// Handler runs a tool once. Its result goes back to the model as the
// tool's answer; an error goes back to the model too (as a tool error it
// can react to), and the operation is journaled as failed.
type Handler func(ctx context.Context, inv Invocation) (string, error)

// Tool is a versioned protocol the model may call.
type Tool struct {
	// Name is what the model calls: 1 to 64 letters, digits, '_' or '-'.
	// Required.
	Name string
	// Version is journaled with every call, so an operation can be read
	// with the contract it ran under. Bump it when the arguments or the
	// effect change. Defaults to "1".
	Version string
	// Description tells the model what the tool does and when to use it.
	Description string
	// Schema is the JSON Schema of the arguments, an object schema.
	// Defaults to {"type":"object"}.
	Schema json.RawMessage
	// Effect is Read or Write. Required: calling a write a read would let
	// recovery repeat it.
	Effect consumer.Effect
	// Handler runs the tool. Required.
	Handler Handler
}

var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ErrInvalidTool is returned by Register for a tool that cannot be offered
// to a model.
var ErrInvalidTool = errors.New("invalid tool")

// compiled is a registered tool: its spec with a compiled schema. It is
// the consumer.Tool the turn runner's journal calls.
type compiled struct {
	spec   Tool
	schema *jsonschema.Schema
	// server, defSHA256 and approval are an MCP tool's: its server, the
	// hash of its definition, and whether its calls wait for approval.
	server    string
	defSHA256 string
	approval  bool
}

func compile(t Tool) (*compiled, error) {
	if !toolName.MatchString(t.Name) {
		return nil, fmt.Errorf("%w: name %q: use 1 to 64 letters, digits, '_' or '-'", ErrInvalidTool, t.Name)
	}
	if t.Version == "" {
		t.Version = "1"
	}
	if t.Effect != Read && t.Effect != Write {
		return nil, fmt.Errorf("%w %q: effect %q: say agent.Read or agent.Write", ErrInvalidTool, t.Name, t.Effect)
	}
	if t.Handler == nil {
		return nil, fmt.Errorf("%w %q: no handler", ErrInvalidTool, t.Name)
	}
	if len(bytes.TrimSpace(t.Schema)) == 0 {
		t.Schema = json.RawMessage(`{"type":"object"}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(t.Schema))
	if err != nil {
		return nil, fmt.Errorf("%w %q: schema is not JSON: %v", ErrInvalidTool, t.Name, err)
	}
	var params map[string]any
	if err := json.Unmarshal(t.Schema, &params); err != nil || params["type"] != "object" {
		return nil, fmt.Errorf("%w %q: schema must be an object schema, {\"type\":\"object\", ...}: model servers pass arguments as one JSON object", ErrInvalidTool, t.Name)
	}
	c := jsonschema.NewCompiler()
	loc := "baton-tool:///" + t.Name + ".json"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("%w %q: schema: %v", ErrInvalidTool, t.Name, err)
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("%w %q: schema does not compile: %v", ErrInvalidTool, t.Name, err)
	}
	return &compiled{spec: t, schema: sch}, nil
}

// Spec declares the tool to agents (consumer.DeclaredTool).
func (c *compiled) Spec() consumer.ToolSpec {
	return consumer.ToolSpec{Name: c.spec.Name, Description: c.spec.Description, Schema: c.spec.Schema}
}

// Validate checks the model's arguments before anything runs
// (consumer.DeclaredTool). Its errors are written for the model, which
// gets them as the tool's answer.
func (c *compiled) Validate(args json.RawMessage) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return fmt.Errorf("the arguments %q are not valid JSON (%v); call %s again with one JSON object that matches its schema", truncate(string(args), 200), err, c.spec.Name)
	}
	if err := c.schema.Validate(inst); err != nil {
		return fmt.Errorf("the arguments do not match the schema of %s: %v; call it again with corrected arguments", c.spec.Name, err)
	}
	return nil
}

func (c *compiled) Name() string            { return c.spec.Name }
func (c *compiled) Version() string         { return c.spec.Version }
func (c *compiled) Effect() consumer.Effect { return c.spec.Effect }

// NeedsApproval: an MCP write the operator's policy marks waits for a
// person (consumer.ApprovalTool).
func (c *compiled) NeedsApproval() bool { return c.approval }

// DefinitionSHA256 is an MCP tool's definition hash (consumer.DefinedTool).
func (c *compiled) DefinitionSHA256() string { return c.defSHA256 }

// IdempotencyKey is the key of a call (consumer.KeyedTool): an MCP
// server's own, so that no two servers ever get the same one.
func (c *compiled) IdempotencyKey(runID, toolCallID string) string {
	if c.server != "" {
		return mcpIdempotencyKey(c.server, runID, toolCallID)
	}
	return consumer.IdempotencyKey(runID, toolCallID)
}

// Call runs the handler. A handler's error is marked as the tool's
// (consumer.ToolError), so the tool loop can tell it from a journal error
// (a lost lease, a deleted conversation), which must end the turn instead.
func (c *compiled) Call(ctx context.Context, inv consumer.Invocation) (string, error) {
	out, err := c.spec.Handler(ctx, inv)
	var unknown *consumer.OutcomeUnknownError
	switch {
	case errors.As(err, &unknown):
		// Not the model's to react to: a write's effect may have
		// happened, and the turn must fail visibly.
		return "", err
	case err != nil:
		return "", &ToolError{Tool: c.spec.Name, Err: err}
	}
	return out, nil
}

// ToolError is a tool's own failure: it goes back to the model, which may
// try otherwise; it does not fail the turn.
type ToolError = consumer.ToolError
