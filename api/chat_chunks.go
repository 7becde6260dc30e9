package api

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// The AI SDK's UI message stream, version 1: server-sent events whose data
// is one JSON chunk each, and "[DONE]" at the end. Every chunk Baton sends
// is built in this file, with only the fields that the strict chunk
// schemas of the AI SDK's clients (ai 6 and 7) accept. A new kind of chunk
// is one more method of uiStream.

// uiStreamHeader marks a response as a UI message stream.
const uiStreamHeader = "x-vercel-ai-ui-message-stream"

// Texts a chat client shows.
const (
	toolFailedText   = "The tool call failed."
	toolUnendedText  = "The tool call did not finish."
	toolDeniedText   = "The tool call was not made."
	chatDeletedText  = "The chat was deleted."
	chatVanishedText = "The turn that answers this message is no longer known."
)

// uiChunk is one chunk of the stream. Fields left empty are left out.
type uiChunk struct {
	Type            string          `json:"type"`
	ID              string          `json:"id,omitempty"`
	MessageID       string          `json:"messageId,omitempty"`
	Delta           string          `json:"delta,omitempty"`
	ApprovalID      string          `json:"approvalId,omitempty"`
	ToolCallID      string          `json:"toolCallId,omitempty"`
	ToolName        string          `json:"toolName,omitempty"`
	Input           json.RawMessage `json:"input,omitempty"`
	Output          *string         `json:"output,omitempty"`
	ErrorText       string          `json:"errorText,omitempty"`
	Dynamic         bool            `json:"dynamic,omitempty"`
	FinishReason    string          `json:"finishReason,omitempty"`
	MessageMetadata *replyMetadata  `json:"messageMetadata,omitempty"`
}

// replyMetadata is what a reply's metadata says, in the stream's finish
// and in the history: that a stop ended it, that the model cut it off,
// that the turn failed. A message with nothing notable has none.
type replyMetadata struct {
	Stopped   bool `json:"stopped,omitempty"`
	Truncated bool `json:"truncated,omitempty"`
	Failed    bool `json:"failed,omitempty"`
}

func metadataOf(m schema.ChatMessage) *replyMetadata {
	md := replyMetadata{Stopped: m.Stopped || m.Settled, Truncated: m.Truncated, Failed: m.Role == schema.RoleError}
	if md == (replyMetadata{}) {
		return nil
	}
	return &md
}

// uiStream writes a UI message stream for one reply. It keeps what it has
// sent of the reply (the parts of its current step), so that whatever
// tells it the reply's state next (a live delta, a worker's snapshot, the
// committed reply) sends only what the client lacks.
type uiStream struct {
	sse *sseWriter

	started bool
	// messageID is the reply's id, sent in start.
	messageID string
	// sent mirrors the parts of the current step; offset is where they
	// begin in the reply as the run shows it (non-zero after a step was
	// given up, below).
	sent   []batonnats.LivePart
	offset int
	// openText is the id of the text part being written, if any; texts
	// numbers the text parts.
	openText string
	texts    int
	// tools are the tool calls the client has, in any step.
	tools map[string]bool
}

func newUIStream(sse *sseWriter) *uiStream {
	return &uiStream{sse: sse, tools: map[string]bool{}}
}

// seed takes parts as sent: the client has them already (the reply it
// continues, in a request that answers an approval), so that the run's
// showing them again sends nothing.
func (u *uiStream) seed(parts []batonnats.LivePart) {
	u.sent = parts
	for _, p := range parts {
		if p.Type == batonnats.PartTool {
			u.tools[p.ToolCallID] = true
		}
	}
}

// begin answers 200 with the stream's headers.
func (u *uiStream) begin() {
	h := u.sse.header()
	h.Set("Cache-Control", "no-cache, no-store")
	h.Set(uiStreamHeader, "v1")
	u.sse.open()
	u.sse.flush()
}

func (u *uiStream) write(c uiChunk) {
	if u.sse.done() {
		return
	}
	b, err := json.Marshal(c)
	if err != nil {
		u.sse.err = err
		return
	}
	u.sse.send("", "", string(b))
}

// start opens the reply under its id, with its first step.
func (u *uiStream) start(messageID string) {
	if u.started {
		return
	}
	u.started, u.messageID = true, messageID
	u.write(uiChunk{Type: "start", MessageID: messageID})
	u.write(uiChunk{Type: "start-step"})
}

func (u *uiStream) closeText() {
	if u.openText != "" {
		u.write(uiChunk{Type: "text-end", ID: u.openText})
		u.openText = ""
	}
}

// sync sends what the client lacks of the reply as the run shows it,
// parts: new text as deltas, new tool calls and their outcomes. Text
// never shrinks on the client: when the run's text no longer begins with
// what was sent (an attempt started over), the current step is given up
// and the rest of the reply follows in a new step. A run that shows less
// than was sent, but nothing else, sends nothing until it shows more: it
// may show the same again (a resumed turn shows its text so far first).
func (u *uiStream) sync(parts []batonnats.LivePart) {
	if !u.started {
		return
	}
	if u.offset > len(parts) {
		// The run shows less than the steps given up: start over.
		u.newStep(0)
	}
	target := parts[u.offset:]
	i := 0
	for ; i < len(u.sent) && i < len(target); i++ {
		s, t := &u.sent[i], target[i]
		if s.Type != t.Type {
			break
		}
		if t.Type == batonnats.PartText {
			if t.Text == s.Text {
				continue
			}
			if i == len(u.sent)-1 && u.openText != "" && strings.HasPrefix(t.Text, s.Text) {
				u.write(uiChunk{Type: "text-delta", ID: u.openText, Delta: t.Text[len(s.Text):]})
				s.Text = t.Text
				continue
			}
			if i == len(target)-1 && strings.HasPrefix(s.Text, t.Text) {
				// The run shows the start of what was sent, for now.
				continue
			}
			break
		}
		if s.ToolCallID != t.ToolCallID {
			break
		}
		if s.State != t.State {
			if s.State != batonnats.ToolInputAvailable {
				break
			}
			u.toolOutcome(t)
			s.State, s.Output = t.State, t.Output
		}
	}
	if i < len(u.sent) && i < len(target) {
		// A part differs from what was sent.
		u.newStep(u.offset + i)
		target = parts[u.offset:]
		i = 0
	}
	for _, t := range target[i:] {
		u.part(t)
	}
}

// newStep gives up the current step: the client keeps what it shows, and
// the reply goes on from parts[offset] in a new step.
func (u *uiStream) newStep(offset int) {
	u.closeText()
	u.write(uiChunk{Type: "finish-step"})
	u.write(uiChunk{Type: "start-step"})
	u.sent, u.offset = nil, offset
}

// part sends a new part.
func (u *uiStream) part(p batonnats.LivePart) {
	switch p.Type {
	case batonnats.PartText:
		if p.Text == "" {
			return
		}
		if u.openText == "" {
			u.texts++
			u.openText = "text-" + strconv.Itoa(u.texts)
			u.write(uiChunk{Type: "text-start", ID: u.openText})
		}
		u.write(uiChunk{Type: "text-delta", ID: u.openText, Delta: p.Text})
	case batonnats.PartTool:
		u.closeText()
		input := p.Input
		if len(input) == 0 {
			input = json.RawMessage(`{}`)
		}
		u.write(uiChunk{Type: "tool-input-available", ToolCallID: p.ToolCallID, ToolName: p.Tool, Input: input, Dynamic: true})
		u.tools[p.ToolCallID] = true
		if p.State != batonnats.ToolInputAvailable {
			u.toolOutcome(p)
		}
	default:
		return
	}
	u.sent = append(u.sent, p)
}

func (u *uiStream) toolOutcome(p batonnats.LivePart) {
	switch p.State {
	case batonnats.ToolOutputAvailable:
		out := p.Output
		u.write(uiChunk{Type: "tool-output-available", ToolCallID: p.ToolCallID, Output: &out, Dynamic: true})
	case batonnats.ToolOutputError:
		u.write(uiChunk{Type: "tool-output-error", ToolCallID: p.ToolCallID, ErrorText: toolFailedText, Dynamic: true})
	case batonnats.ToolOutputDenied:
		u.write(uiChunk{Type: "tool-output-denied", ToolCallID: p.ToolCallID})
	}
}

// awaitApproval ends the stream of a turn that waits for its user to
// approve or deny a call: the call, unless the client has it, then the
// request for approval (which useChat shows, and answers with
// addToolApprovalResponse in its next request), and the reply's end for
// now. The turn holds nothing meanwhile; the request that answers the
// approval streams the rest of the same reply.
func (u *uiStream) awaitApproval(a *schema.ChatApproval) {
	u.start(a.ReplyID)
	u.closeText()
	if !u.tools[a.ToolCallID] {
		u.part(batonnats.LivePart{Type: batonnats.PartTool, ToolCallID: a.ToolCallID, Tool: a.Tool, Input: a.Arguments, State: batonnats.ToolInputAvailable})
	}
	u.write(uiChunk{Type: "tool-approval-request", ApprovalID: a.ID, ToolCallID: a.ToolCallID})
	u.write(uiChunk{Type: "finish-step"})
	u.write(uiChunk{Type: "finish", FinishReason: "tool-calls"})
	u.end()
}

// sentText is the text of the current step, as sent.
func (u *uiStream) sentText() string {
	var b strings.Builder
	for _, p := range u.sent {
		if p.Type == batonnats.PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// finish ends the stream with the committed reply: what the client lacks
// of it first (live deltas are previews; some may have been lost), then
// the reply's end, marked as the reply is.
func (u *uiStream) finish(m schema.ChatMessage) {
	u.start(m.ID)
	u.reconcile(m)
	u.closeText()
	u.write(uiChunk{Type: "finish-step"})
	reason := "stop"
	switch {
	case m.Stopped:
		reason = "other"
	case m.Truncated:
		reason = "length"
	}
	u.write(uiChunk{Type: "finish", FinishReason: reason, MessageMetadata: metadataOf(m)})
	u.end()
}

// reconcile sends what the client lacks of the committed reply m: its
// tool calls or their outcomes not sent yet, and the rest of its text
// when what was sent begins it. When the text sent is not the start of
// the reply's (the client watched a run whose text the reply does not
// keep), the reply follows whole in a new step.
func (u *uiStream) reconcile(m schema.ChatMessage) {
	sentText := u.sentText()
	if !strings.HasPrefix(m.Content, sentText) {
		u.newStep(u.offset)
		for _, p := range committedParts(m) {
			u.part(p)
		}
		return
	}
	for _, t := range committedParts(m) {
		if t.Type != batonnats.PartTool {
			continue
		}
		i := slices.IndexFunc(u.sent, func(p batonnats.LivePart) bool { return p.Type == batonnats.PartTool && p.ToolCallID == t.ToolCallID })
		switch {
		case i < 0:
			u.part(t)
		case u.sent[i].State == batonnats.ToolInputAvailable:
			u.toolOutcome(t)
			u.sent[i].State, u.sent[i].Output = t.State, t.Output
		}
	}
	rest := m.Content[len(sentText):]
	if rest == "" {
		return
	}
	if n := len(u.sent); n > 0 && u.sent[n-1].Type == batonnats.PartText && u.openText != "" {
		u.write(uiChunk{Type: "text-delta", ID: u.openText, Delta: rest})
		u.sent[n-1].Text += rest
		return
	}
	u.part(batonnats.LivePart{Type: batonnats.PartText, Text: rest})
}

// committedParts are the parts of a committed reply: its tool calls, then
// its text (the journal keeps no place of a call in the text).
func committedParts(m schema.ChatMessage) []batonnats.LivePart {
	var out []batonnats.LivePart
	for _, t := range m.Tools {
		p := batonnats.LivePart{Type: batonnats.PartTool, ToolCallID: t.CallID, Tool: t.Tool, Input: t.Input, State: batonnats.ToolOutputError}
		switch t.Status {
		case "completed":
			p.State, p.Output = batonnats.ToolOutputAvailable, t.Output
		case "denied":
			p.State = batonnats.ToolOutputDenied
		}
		out = append(out, p)
	}
	if m.Content != "" {
		out = append(out, batonnats.LivePart{Type: batonnats.PartText, Text: m.Content})
	}
	return out
}

// fail ends the stream with an error chunk: the turn failed (its user
// text), or the chat went away.
func (u *uiStream) fail(text string) {
	u.closeText()
	u.write(uiChunk{Type: "error", ErrorText: text})
	u.end()
}

// settle ends the stream of a message that a stop settled before any turn
// answered it: there is no reply to show.
func (u *uiStream) settle() {
	if u.started {
		u.closeText()
		u.write(uiChunk{Type: "finish-step"})
	}
	u.write(uiChunk{Type: "finish", FinishReason: "other"})
	u.end()
}

func (u *uiStream) end() {
	u.sse.send("", "", "[DONE]")
	u.sse.flush()
	u.sse.close()
}
