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
	// open is the id of the text or reasoning part being written, if any,
	// and openKind its kind (batonnats.PartText or PartReasoning); texts
	// and thoughts number the parts of each kind.
	open, openKind  string
	texts, thoughts int
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

// closePart ends the text or reasoning part being written.
func (u *uiStream) closePart() {
	if u.open == "" {
		return
	}
	end := "text-end"
	if u.openKind == batonnats.PartReasoning {
		end = "reasoning-end"
	}
	u.write(uiChunk{Type: end, ID: u.open})
	u.open, u.openKind = "", ""
}

// writing reports whether the last part sent is a text or reasoning part
// of kind still being written.
func (u *uiStream) writing(kind string) bool {
	n := len(u.sent)
	return u.open != "" && u.openKind == kind && n > 0 && u.sent[n-1].Type == kind
}

// deltaType is the chunk that appends to a part of kind.
func deltaType(kind string) string {
	if kind == batonnats.PartReasoning {
		return "reasoning-delta"
	}
	return "text-delta"
}

// textual reports whether parts of kind are text that grows: text and
// reasoning.
func textual(kind string) bool { return kind == batonnats.PartText || kind == batonnats.PartReasoning }

// known leaves out the parts of kinds this version does not send (a
// newer worker's snapshot may hold some), so that they never count as a
// difference from what was sent.
func known(parts []batonnats.LivePart) []batonnats.LivePart {
	for _, p := range parts {
		if !textual(p.Type) && p.Type != batonnats.PartTool {
			return slices.DeleteFunc(slices.Clone(parts), func(p batonnats.LivePart) bool {
				return !textual(p.Type) && p.Type != batonnats.PartTool
			})
		}
	}
	return parts
}

// sync sends what the client lacks of the reply as the run shows it,
// parts: new text and reasoning as deltas, new tool calls and their
// outcomes. Text and reasoning never shrink on the client: when the run's
// no longer begin with what was sent (an attempt started over), the
// current step is given up and the rest of the reply follows in a new
// step. A run that shows less than was sent, but nothing else, sends
// nothing until it shows more: it may show the same again (a resumed turn
// shows its text so far first).
func (u *uiStream) sync(parts []batonnats.LivePart) {
	if !u.started {
		return
	}
	parts = known(parts)
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
		if textual(t.Type) {
			if t.Text == s.Text {
				continue
			}
			if i == len(u.sent)-1 && u.writing(t.Type) && strings.HasPrefix(t.Text, s.Text) {
				u.write(uiChunk{Type: deltaType(t.Type), ID: u.open, Delta: t.Text[len(s.Text):]})
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
	u.closePart()
	u.write(uiChunk{Type: "finish-step"})
	u.write(uiChunk{Type: "start-step"})
	u.sent, u.offset = nil, offset
}

// part sends a new part.
func (u *uiStream) part(p batonnats.LivePart) {
	switch p.Type {
	case batonnats.PartText, batonnats.PartReasoning:
		if p.Text == "" {
			return
		}
		if u.open == "" || u.openKind != p.Type {
			u.closePart()
			start := "text-start"
			if p.Type == batonnats.PartReasoning {
				u.thoughts++
				u.open, start = "reasoning-"+strconv.Itoa(u.thoughts), "reasoning-start"
			} else {
				u.texts++
				u.open = "text-" + strconv.Itoa(u.texts)
			}
			u.openKind = p.Type
			u.write(uiChunk{Type: start, ID: u.open})
		}
		u.write(uiChunk{Type: deltaType(p.Type), ID: u.open, Delta: p.Text})
	case batonnats.PartTool:
		u.closePart()
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
	// What the turn said before it stopped, as the journal holds it: the
	// live deltas that showed it are previews, and some may have been
	// lost.
	u.reconcile(schema.ChatMessage{ID: a.ReplyID, Content: a.Text, Reasoning: a.Reasoning})
	u.closePart()
	if !u.tools[a.ToolCallID] {
		u.part(batonnats.LivePart{Type: batonnats.PartTool, ToolCallID: a.ToolCallID, Tool: a.Tool, Input: a.Arguments, State: batonnats.ToolInputAvailable})
	}
	u.write(uiChunk{Type: "tool-approval-request", ApprovalID: a.ID, ToolCallID: a.ToolCallID})
	u.write(uiChunk{Type: "finish-step"})
	u.write(uiChunk{Type: "finish", FinishReason: "tool-calls"})
	u.end()
}

// sentText is the text (kind batonnats.PartText) or the reasoning
// (PartReasoning) of the current step, as sent.
func (u *uiStream) sentText(kind string) string {
	var b strings.Builder
	for _, p := range u.sent {
		if p.Type == kind {
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
	u.closePart()
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
// tool calls or their outcomes not sent yet, and the rest of its
// reasoning and of its text when what was sent begins them. When the text
// or the reasoning sent is not the start of the reply's (the client
// watched a run whose text the reply does not keep), the reply follows
// whole in a new step.
func (u *uiStream) reconcile(m schema.ChatMessage) {
	sentText, sentThought := u.sentText(batonnats.PartText), u.sentText(batonnats.PartReasoning)
	if !strings.HasPrefix(m.Content, sentText) || !strings.HasPrefix(m.Reasoning, sentThought) {
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
	u.rest(batonnats.PartReasoning, m.Reasoning[len(sentThought):])
	u.rest(batonnats.PartText, m.Content[len(sentText):])
}

// rest sends the rest of the reply's text or reasoning: in the part being
// written when it is of that kind, else in a part of its own.
func (u *uiStream) rest(kind, text string) {
	if text == "" {
		return
	}
	if u.writing(kind) {
		u.write(uiChunk{Type: deltaType(kind), ID: u.open, Delta: text})
		u.sent[len(u.sent)-1].Text += text
		return
	}
	u.part(batonnats.LivePart{Type: kind, Text: text})
}

// committedParts are the parts of a committed reply: its reasoning, its
// tool calls, then its text (the journal keeps no place of a call in the
// text, nor of the reasoning of each step).
func committedParts(m schema.ChatMessage) []batonnats.LivePart {
	var out []batonnats.LivePart
	if m.Reasoning != "" {
		out = append(out, batonnats.LivePart{Type: batonnats.PartReasoning, Text: m.Reasoning})
	}
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
	u.closePart()
	u.write(uiChunk{Type: "error", ErrorText: text})
	u.end()
}

// settle ends the stream of a message that a stop settled before any turn
// answered it: there is no reply to show.
func (u *uiStream) settle() {
	if u.started {
		u.closePart()
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
