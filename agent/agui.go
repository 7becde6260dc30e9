package agent

import (
	"encoding/json"
	"strconv"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// agui is AG-UI 1.0 (ProtocolAGUI): each step is a run of the agent on
// the conversation's thread, its RunAgentInput holding the whole turn so
// far; the answer is a stream of AG-UI events.
type agui struct{}

// aguiInput is AG-UI's RunAgentInput.
type aguiInput struct {
	ThreadID        string         `json:"threadId"`
	RunID           string         `json:"runId"`
	ProtocolVersion string         `json:"protocolVersion"`
	Messages        []aguiMessage  `json:"messages"`
	Tools           []aguiTool     `json:"tools"`
	Context         []any          `json:"context"`
	State           map[string]any `json:"state"`
	ForwardedProps  aguiForwarded  `json:"forwardedProps"`
	// Resume answers the interrupts that ended the step before.
	Resume []aguiResume `json:"resume,omitempty"`
}

// aguiResume is the answer to one interrupt.
type aguiResume struct {
	InterruptID string          `json:"interruptId"`
	Status      string          `json:"status"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

type aguiMessage struct {
	ID         string         `json:"id"`
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []aguiToolCall `json:"toolCalls,omitempty"`
	ToolCallID string         `json:"toolCallId,omitempty"`
	Error      string         `json:"error,omitempty"`
}

// aguiInputContent is a part of a user message's content: text, or a
// file by its URL.
type aguiInputContent struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	MimeType string `json:"mimeType,omitempty"`
	URL      string `json:"url,omitempty"`
	Filename string `json:"filename,omitempty"`
}

type aguiToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type aguiTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

type aguiForwarded struct {
	Baton batonProps `json:"baton"`
}

// batonProps tell an agent which step of which turn it answers.
type batonProps struct {
	// Conversation is the conversation's server key.
	Conversation string `json:"conversation"`
	Turn         string `json:"turn"`
	Step         int    `json:"step"`
	// RunID is the step's key, for a protocol that has no run id of its
	// own.
	RunID   string `json:"runId,omitempty"`
	Attempt int    `json:"attempt"`
	Epoch   int    `json:"epoch"`
}

func propsOf(in stepInput) batonProps {
	t := in.req.Turn
	return batonProps{Conversation: t.ConversationID, Turn: t.TurnID, Step: in.req.Index, Attempt: max(t.Attempt, 1), Epoch: t.Epoch}
}

// conversationOf is the history and the turn's messages, oldest first,
// without Baton's error messages: what was said, not what failed.
func conversationOf(t *consumer.Turn) []schema.Message {
	out := make([]schema.Message, 0, len(t.History)+len(t.Messages))
	for _, m := range t.History {
		if m.Role == schema.RoleUser || m.Role == schema.RoleAssistant {
			out = append(out, m)
		}
	}
	return append(out, t.Messages...)
}

// messageID is a message's id, or one made from its place for a message
// that has none.
func messageID(m schema.Message, i int) string {
	if m.ID != "" {
		return m.ID
	}
	return "message-" + strconv.Itoa(i+1)
}

// stepMessageID is the id of the assistant message of step index of a
// turn.
func stepMessageID(turn string, index int) string { return turn + "-" + strconv.Itoa(index) }

// toolSchema is a tool's parameters, an empty object schema when it
// declared none.
func toolSchema(s consumer.ToolSpec) json.RawMessage {
	if len(s.Schema) == 0 {
		return json.RawMessage(`{"type":"object"}`)
	}
	return s.Schema
}

func (agui) body(in stepInput) any {
	req := in.req
	body := aguiInput{
		ThreadID: in.thread, RunID: in.key, ProtocolVersion: "1.0",
		Messages: []aguiMessage{}, Tools: []aguiTool{}, Context: []any{}, State: map[string]any{},
		ForwardedProps: aguiForwarded{Baton: propsOf(in)},
	}
	for i, m := range conversationOf(req.Turn) {
		content := m.Content
		msg := aguiMessage{ID: messageID(m, i), Role: m.Role, Content: &content}
		if files := in.files[m.Key]; len(files) > 0 {
			// A user message with files: AG-UI's content parts, a
			// binary part with the link to each file.
			var parts []aguiInputContent
			for _, f := range files {
				if f.url == "" {
					content += "\n\n" + leftOutNote(f.file)
					continue
				}
				parts = append(parts, aguiInputContent{Type: "binary", MimeType: f.file.MediaType, URL: f.url, Filename: f.file.Filename})
			}
			if len(parts) > 0 {
				if content != "" {
					parts = append([]aguiInputContent{{Type: "text", Text: content}}, parts...)
				}
				msg.Content = parts
			}
		}
		body.Messages = append(body.Messages, msg)
	}
	for i, s := range req.Steps {
		msg := aguiMessage{ID: stepMessageID(req.Turn.TurnID, i), Role: "assistant"}
		if s.Text != "" {
			text := s.Text
			msg.Content = &text
		}
		for _, c := range s.Calls {
			tc := aguiToolCall{ID: c.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = c.Tool, string(c.Arguments)
			msg.ToolCalls = append(msg.ToolCalls, tc)
		}
		body.Messages = append(body.Messages, msg)
		for j, c := range s.Calls {
			var r consumer.ToolResult
			if j < len(s.Results) {
				r = s.Results[j]
			}
			content := r.Output
			if r.Error != "" && content == "" {
				// Not every agent reads error: the content says it too.
				content = "error: " + r.Error
			}
			body.Messages = append(body.Messages, aguiMessage{ID: c.ID + "-result", Role: "tool", ToolCallID: c.ID, Content: &content, Error: r.Error})
		}
	}
	for _, s := range req.Tools {
		body.Tools = append(body.Tools, aguiTool{Name: s.Name, Description: s.Description, Parameters: toolSchema(s)})
	}
	if n := len(req.Steps); n > 0 {
		// The run that continues from interrupts answers them: resolved
		// with the person's answer, or cancelled when they declined or
		// did not answer in time.
		for _, q := range req.Steps[n-1].Questions {
			r := aguiResume{InterruptID: q.ID, Status: "cancelled"}
			if q.Status == schema.ApprovalApproved {
				r.Status, r.Payload = "resolved", answerOf(q)
			}
			body.Resume = append(body.Resume, r)
		}
	}
	return body
}

func (agui) endEvent() string { return "RUN_FINISHED or RUN_ERROR" }

func (agui) decoder(a *answer) eventDecoder {
	return &aguiDecoder{a: a, roles: map[string]string{}}
}

// aguiDecoder reads AG-UI events. Text comes as TEXT_MESSAGE_START,
// CONTENT and END, or as TEXT_MESSAGE_CHUNK alone (Mastra); tool calls as
// TOOL_CALL_START, ARGS and END, or TOOL_CALL_CHUNK; a call that the
// agent ran itself has a TOOL_CALL_RESULT. RUN_FINISHED ends the step,
// RUN_ERROR fails it; events after either are not read (LangGraph sends
// more after RUN_ERROR). State, snapshots, RAW, CUSTOM, steps, activity
// and any type Baton does not know are skipped: only their type is
// decoded.
type aguiDecoder struct {
	a *answer
	// roles are the roles of the text messages that are not the
	// assistant's, whose text is not the reply.
	roles map[string]string
	// chunkText and chunkCall are the message and the tool call that a
	// chunk without an id continues.
	chunkText, chunkCall string
	// legacy are interrupts of the CUSTOM event on_interrupt, for an
	// agent that does not put them in RUN_FINISHED's outcome.
	legacy []Interrupt
}

// aguiEvent holds the fields of the events Baton reads.
type aguiEvent struct {
	Type         string          `json:"type"`
	MessageID    *string         `json:"messageId"`
	Role         string          `json:"role"`
	Delta        *string         `json:"delta"`
	ToolCallID   *string         `json:"toolCallId"`
	ToolCallName *string         `json:"toolCallName"`
	Name         string          `json:"name"`
	Value        json.RawMessage `json:"value"`
	Message      *string         `json:"message"`
	Code         string          `json:"code"`
	Outcome      *struct {
		Type       string      `json:"type"`
		Interrupts []Interrupt `json:"interrupts"`
	} `json:"outcome"`
}

func (d *aguiDecoder) event(data []byte) (bool, error) {
	var head struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return false, malformedf("an event is not a JSON object (%s): %q", err, truncate(string(data), 60))
	}
	switch head.Type {
	case "":
		return false, malformedf("an event has no type: %q", truncate(string(data), 60))
	case "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "TEXT_MESSAGE_CHUNK",
		"REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_CHUNK",
		"TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_CHUNK", "TOOL_CALL_RESULT",
		"RUN_FINISHED", "RUN_ERROR":
	case "CUSTOM":
		if head.Name != "on_interrupt" {
			return false, nil
		}
	default:
		return false, nil
	}
	var e aguiEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return false, malformedf("a %s event does not have the fields of one (%s)", head.Type, err)
	}
	return d.read(e)
}

func (d *aguiDecoder) read(e aguiEvent) (bool, error) {
	a := d.a
	switch e.Type {
	case "TEXT_MESSAGE_START":
		if e.MessageID == nil {
			return false, missing(e.Type, "messageId")
		}
		if e.Role != "" && e.Role != "assistant" {
			d.roles[*e.MessageID] = e.Role
		}
	case "TEXT_MESSAGE_CONTENT":
		switch {
		case e.MessageID == nil:
			return false, missing(e.Type, "messageId")
		case e.Delta == nil:
			return false, missing(e.Type, "delta")
		}
		if d.roles[*e.MessageID] == "" {
			a.addText(*e.MessageID, *e.Delta)
		}
	case "TEXT_MESSAGE_CHUNK":
		if e.MessageID != nil && *e.MessageID != "" {
			d.chunkText = *e.MessageID
			if e.Role != "" && e.Role != "assistant" {
				d.roles[d.chunkText] = e.Role
			}
		}
		if e.Delta != nil && d.roles[d.chunkText] == "" {
			a.addText(d.chunkText, *e.Delta)
		}
	case "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_CHUNK":
		if e.Delta != nil {
			id := ""
			if e.MessageID != nil {
				id = *e.MessageID
			}
			a.addReasoning(id, *e.Delta)
		}
	case "TOOL_CALL_START":
		switch {
		case e.ToolCallID == nil || *e.ToolCallID == "":
			return false, missing(e.Type, "toolCallId")
		case e.ToolCallName == nil || *e.ToolCallName == "":
			return false, missing(e.Type, "toolCallName")
		}
		_, err := a.startCall(*e.ToolCallID, *e.ToolCallName)
		return false, err
	case "TOOL_CALL_ARGS":
		switch {
		case e.ToolCallID == nil:
			return false, missing(e.Type, "toolCallId")
		case e.Delta == nil:
			return false, missing(e.Type, "delta")
		}
		c, ok := a.byID[*e.ToolCallID]
		if !ok {
			return false, malformedf("TOOL_CALL_ARGS for tool call %q, which no TOOL_CALL_START opened", truncate(*e.ToolCallID, 60))
		}
		c.args.WriteString(*e.Delta)
	case "TOOL_CALL_END":
		if e.ToolCallID == nil {
			return false, missing(e.Type, "toolCallId")
		}
	case "TOOL_CALL_CHUNK":
		return false, d.toolCallChunk(e)
	case "TOOL_CALL_RESULT":
		if e.ToolCallID == nil {
			return false, missing(e.Type, "toolCallId")
		}
		a.ran(*e.ToolCallID)
	case "CUSTOM":
		d.legacy = append(d.legacy, legacyInterrupt(e.Value))
	case "RUN_ERROR":
		msg := "(no message)"
		if e.Message != nil {
			msg = *e.Message
		}
		if e.Code != "" {
			msg += " (code " + e.Code + ")"
		}
		return true, &runFailure{what: "the agent's run failed (RUN_ERROR: " + msg + ")"}
	case "RUN_FINISHED":
		return true, d.finished(e)
	}
	return false, nil
}

// toolCallChunk reads a TOOL_CALL_CHUNK: the first of a call names it,
// the next ones may only carry arguments.
func (d *aguiDecoder) toolCallChunk(e aguiEvent) error {
	id := d.chunkCall
	if e.ToolCallID != nil && *e.ToolCallID != "" {
		id = *e.ToolCallID
	}
	if id == "" {
		return malformedf("a TOOL_CALL_CHUNK has no toolCallId and continues no tool call")
	}
	c, ok := d.a.byID[id]
	if !ok {
		if e.ToolCallName == nil || *e.ToolCallName == "" {
			return malformedf("the TOOL_CALL_CHUNK that starts tool call %q has no toolCallName", truncate(id, 60))
		}
		var err error
		if c, err = d.a.startCall(id, *e.ToolCallName); err != nil {
			return err
		}
	}
	d.chunkCall = id
	if e.Delta != nil {
		c.args.WriteString(*e.Delta)
	}
	return nil
}

func (d *aguiDecoder) finished(e aguiEvent) error {
	switch {
	case e.Outcome != nil && e.Outcome.Type == "interrupt":
		if len(e.Outcome.Interrupts) == 0 {
			return malformedf("RUN_FINISHED has an interrupt outcome without interrupts")
		}
		d.a.interrupts = e.Outcome.Interrupts
	case e.Outcome != nil && e.Outcome.Type == "cancelled":
		return &runFailure{what: "the agent cancelled its run (RUN_FINISHED with outcome cancelled)"}
	default:
		d.a.interrupts = d.legacy
	}
	return nil
}

// legacyInterrupt is the interrupt of a CUSTOM on_interrupt event, whose
// value is the question: a string, or JSON of the agent's.
func legacyInterrupt(value json.RawMessage) Interrupt {
	in := Interrupt{Reason: "on_interrupt"}
	var s string
	if json.Unmarshal(value, &s) == nil {
		in.Message = truncate(s, 500)
	} else if len(value) > 0 {
		in.Message = truncate(string(value), 500)
	}
	return in
}

// missing is an event without a field it needs.
func missing(event, field string) *malformedError {
	return malformedf("a %s event has no %s", event, field)
}
