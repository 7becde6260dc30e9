package agent

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// aisdk is the AI SDK's chat route (ProtocolAISDK): each step is posted
// as useChat posts a message, with Baton's tools and identity beside it;
// the answer is a UI message stream.
type aisdk struct{}

// uiRequest is what useChat's default transport posts, and Baton's
// extras.
type uiRequest struct {
	ID       string      `json:"id"`
	Messages []uiMessage `json:"messages"`
	Trigger  string      `json:"trigger"`
	Tools    []uiTool    `json:"tools"`
	Baton    batonProps  `json:"baton"`
}

type uiMessage struct {
	ID    string `json:"id"`
	Role  string `json:"role"`
	Parts []any  `json:"parts"`
}

type uiTextPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// uiFilePart is a file of a user message: a signed link to it.
type uiFilePart struct {
	Type      string `json:"type"`
	MediaType string `json:"mediaType"`
	Filename  string `json:"filename,omitempty"`
	URL       string `json:"url"`
}

type uiStepStart struct {
	Type string `json:"type"`
}

// uiToolPart is a dynamic tool's part in state output-available or
// output-error, or, for a call of the agent's own that asked for
// approval, approval-responded.
type uiToolPart struct {
	Type       string          `json:"type"`
	ToolName   string          `json:"toolName"`
	ToolCallID string          `json:"toolCallId"`
	State      string          `json:"state"`
	Input      json.RawMessage `json:"input"`
	Output     *string         `json:"output,omitempty"`
	ErrorText  string          `json:"errorText,omitempty"`
	Approval   *uiApproval     `json:"approval,omitempty"`
}

// uiApproval is a person's answer to a tool approval request.
type uiApproval struct {
	ID       string `json:"id"`
	Approved bool   `json:"approved"`
	Reason   string `json:"reason,omitempty"`
}

type uiTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

func (aisdk) body(in stepInput) any {
	req := in.req
	props := propsOf(in)
	props.RunID = in.key
	body := uiRequest{ID: in.thread, Messages: []uiMessage{}, Trigger: "submit-message", Tools: []uiTool{}, Baton: props}
	for i, m := range conversationOf(req.Turn) {
		msg := uiMessage{ID: messageID(m, i), Role: m.Role}
		text := m.Content
		for _, f := range in.files[m.Key] {
			if f.url == "" {
				text += "\n\n" + leftOutNote(f.file)
				continue
			}
			msg.Parts = append(msg.Parts, uiFilePart{Type: "file", MediaType: f.file.MediaType, Filename: f.file.Filename, URL: f.url})
		}
		if text != "" || len(msg.Parts) == 0 {
			msg.Parts = append(msg.Parts, uiTextPart{Type: "text", Text: text})
		}
		body.Messages = append(body.Messages, msg)
	}
	if len(req.Steps) > 0 {
		// The turn's earlier steps are one assistant message, a step
		// each, as the AI SDK keeps a reply of several steps.
		msg := uiMessage{ID: req.Turn.TurnID, Role: "assistant"}
		for _, s := range req.Steps {
			msg.Parts = append(msg.Parts, uiStepStart{Type: "step-start"})
			if s.Text != "" {
				msg.Parts = append(msg.Parts, uiTextPart{Type: "text", Text: s.Text})
			}
			for j, c := range s.Calls {
				var r consumer.ToolResult
				if j < len(s.Results) {
					r = s.Results[j]
				}
				p := uiToolPart{Type: "dynamic-tool", ToolName: c.Tool, ToolCallID: c.ID, State: "output-available", Input: inputOf(c.Arguments)}
				if r.Error != "" {
					p.State, p.ErrorText = "output-error", r.Error
				} else {
					out := r.Output
					p.Output = &out
				}
				msg.Parts = append(msg.Parts, p)
			}
			for _, q := range s.Questions {
				if q.ToolCallID == "" {
					continue
				}
				// The call of the agent's own tool that asked for approval,
				// with the person's answer: the agent runs it, or not.
				a := &uiApproval{ID: q.ID, Approved: q.Status == schema.ApprovalApproved}
				if q.Status == schema.ApprovalExpired {
					a.Reason = "nobody approved it in time"
				}
				msg.Parts = append(msg.Parts, uiToolPart{Type: "dynamic-tool", ToolName: q.Tool, ToolCallID: q.ToolCallID,
					State: "approval-responded", Input: inputOf(q.Arguments), Approval: a})
			}
		}
		body.Messages = append(body.Messages, msg)
	}
	for _, s := range req.Tools {
		body.Tools = append(body.Tools, uiTool{Name: s.Name, Description: s.Description, InputSchema: toolSchema(s)})
	}
	return body
}

// inputOf is a call's arguments as a tool part's input: the JSON they
// are, or the text the agent wrote when it is not JSON.
func inputOf(args json.RawMessage) json.RawMessage {
	trimmed := bytes.TrimSpace(args)
	switch {
	case len(trimmed) == 0:
		return json.RawMessage(`{}`)
	case json.Valid(trimmed):
		return trimmed
	}
	b, _ := json.Marshal(string(args))
	return b
}

func (aisdk) endEvent() string { return "a finish chunk or [DONE]" }

func (aisdk) decoder(a *answer) eventDecoder { return &aisdkDecoder{a: a} }

// aisdkDecoder reads a UI message stream. Text and reasoning come in
// parts (start, deltas, end); a tool call as tool-input-start, deltas and
// tool-input-available, or tool-input-available alone; a call the agent
// ran itself (or its provider did) has a tool output. A finish chunk or
// [DONE] ends the step, an error or abort chunk fails it. A finish-step
// does not: the agent may go on with steps of its own (after a tool it
// ran itself) within Baton's one step, and their texts are paragraphs of
// the step's text. Metadata, data, sources and files are skipped.
type aisdkDecoder struct {
	a *answer
	// steps counts the agent's own steps (start-step): the text of a
	// later one is a paragraph of its own.
	steps int
}

// uiChunk holds the fields of the chunks Baton reads.
type uiChunk struct {
	Type             string          `json:"type"`
	ID               *string         `json:"id"`
	Delta            *string         `json:"delta"`
	ToolCallID       *string         `json:"toolCallId"`
	ToolName         *string         `json:"toolName"`
	InputTextDelta   *string         `json:"inputTextDelta"`
	Input            json.RawMessage `json:"input"`
	ErrorText        *string         `json:"errorText"`
	ApprovalID       *string         `json:"approvalId"`
	ProviderExecuted bool            `json:"providerExecuted"`
	FinishReason     string          `json:"finishReason"`
	Reason           string          `json:"reason"`
}

var done = []byte("[DONE]")

func (d *aisdkDecoder) event(data []byte) (bool, error) {
	if bytes.Equal(bytes.TrimSpace(data), done) {
		return true, nil
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return false, malformedf("a chunk is not a JSON object (%s): %q", err, truncate(string(data), 60))
	}
	switch head.Type {
	case "":
		return false, malformedf("a chunk has no type: %q", truncate(string(data), 60))
	case "start-step", "text-start", "text-delta", "reasoning-delta",
		"tool-input-start", "tool-input-delta", "tool-input-available", "tool-input-error",
		"tool-output-available", "tool-output-error", "tool-output-denied", "tool-approval-request",
		"finish", "error", "abort":
	default:
		return false, nil
	}
	var c uiChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return false, malformedf("a %s chunk does not have the fields of one (%s)", head.Type, err)
	}
	return d.read(c)
}

func (d *aisdkDecoder) read(c uiChunk) (bool, error) {
	a := d.a
	switch c.Type {
	case "start-step":
		d.steps++
	case "text-start":
		if c.ID == nil {
			return false, missing(c.Type, "id")
		}
		// A part of its own, but in the same step of the agent: no
		// paragraph between the parts of one step.
	case "text-delta":
		if c.Delta == nil {
			return false, missing(c.Type, "delta")
		}
		a.addText("step-"+strconv.Itoa(d.steps), *c.Delta)
	case "reasoning-delta":
		if c.Delta == nil {
			return false, missing(c.Type, "delta")
		}
		a.addReasoning("step-"+strconv.Itoa(d.steps), *c.Delta)
	case "tool-input-start":
		call, err := d.call(c)
		if err != nil {
			return false, err
		}
		call.ran = call.ran || c.ProviderExecuted
	case "tool-input-delta":
		switch {
		case c.ToolCallID == nil:
			return false, missing(c.Type, "toolCallId")
		case c.InputTextDelta == nil:
			return false, missing(c.Type, "inputTextDelta")
		}
		call, ok := a.byID[*c.ToolCallID]
		if !ok {
			return false, malformedf("a tool-input-delta chunk for tool call %q, which no tool-input-start opened", truncate(*c.ToolCallID, 60))
		}
		call.args.WriteString(*c.InputTextDelta)
	case "tool-input-available":
		call, err := d.call(c)
		if err != nil {
			return false, err
		}
		call.ran = call.ran || c.ProviderExecuted
		if len(c.Input) > 0 {
			call.input = c.Input
		}
	case "tool-input-error":
		// The agent's model wrote input that the tool's schema, as the
		// agent knows it, refused. It is still a call: the turn
		// runner checks it against the declared schema itself and
		// answers the agent with why it was refused, as it does for a
		// model's wrong call, so the agent can write it again.
		call, err := d.call(c)
		if err != nil {
			return false, err
		}
		call.ran = call.ran || c.ProviderExecuted
		if raw := rawInput(c.Input); raw != nil {
			call.input = raw
		}
	case "tool-output-available", "tool-output-error", "tool-output-denied":
		if c.ToolCallID == nil {
			return false, missing(c.Type, "toolCallId")
		}
		a.ran(*c.ToolCallID)
	case "tool-approval-request":
		switch {
		case c.ApprovalID == nil:
			return false, missing(c.Type, "approvalId")
		case c.ToolCallID == nil:
			return false, missing(c.Type, "toolCallId")
		}
		a.interrupts = append(a.interrupts, Interrupt{ID: *c.ApprovalID, Reason: "tool_approval", ToolCallID: *c.ToolCallID})
	case "finish":
		switch c.FinishReason {
		case "length":
			a.truncated = true
		case "content-filter":
			a.filtered = true
		}
		return true, nil
	case "error":
		text := "(no text)"
		if c.ErrorText != nil {
			text = *c.ErrorText
		}
		return true, &runFailure{what: "the agent's stream failed (error chunk: " + text + ")"}
	case "abort":
		what := "the agent aborted its answer (abort chunk)"
		if c.Reason != "" {
			what = "the agent aborted its answer (abort chunk: " + c.Reason + ")"
		}
		return true, &runFailure{what: what}
	}
	return false, nil
}

// call returns the call a tool-input chunk names, started now if it is
// new.
func (d *aisdkDecoder) call(c uiChunk) (*agentCall, error) {
	switch {
	case c.ToolCallID == nil || *c.ToolCallID == "":
		return nil, missing(c.Type, "toolCallId")
	case c.ToolName == nil || *c.ToolName == "":
		return nil, missing(c.Type, "toolName")
	}
	return d.a.startCall(*c.ToolCallID, *c.ToolName)
}

// rawInput is the input of a tool-input-error as the agent's model wrote
// it: the text itself when the chunk holds it as a string (input that was
// not JSON), the JSON otherwise; nil when the chunk has none.
func rawInput(input json.RawMessage) json.RawMessage {
	if len(input) == 0 || string(input) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(input, &s) == nil {
		return json.RawMessage(s)
	}
	return input
}
