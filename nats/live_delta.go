package nats

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// LivePrefix is the first tokens of every live subject. Live events are
// core NATS messages, not JetStream: they show a reply while the model
// writes it and are worth nothing afterwards. A subscriber that misses some
// loses a preview, never a reply; the durable reply is only the one that
// finalize commits.
const LivePrefix = "baton.live"

// LiveSubject is the subject of the live events of one run of a
// conversation: "baton.live.<conversation token>.<run id>". The
// conversation is encoded like in Subject; a run ID that is not a valid
// subject token (Baton's run_<uuid> always is) is encoded the same way.
func LiveSubject(conversationID, runID string) string {
	return LivePrefix + "." + EncodeToken(conversationID) + "." + runToken(runID)
}

// LiveConversationSubject matches the live events of every run of a
// conversation, for a subscriber that follows a conversation across
// attempts.
func LiveConversationSubject(conversationID string) string {
	return LivePrefix + "." + EncodeToken(conversationID) + ".*"
}

func validToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}

// DeltaType says what a live delta does to the reply a subscriber shows.
// A subscriber skips a type it does not know: later versions may add
// some, and a snapshot (LiveReply) says what the reply shows whatever
// they were.
type DeltaType string

const (
	// DeltaText appends Text.
	DeltaText DeltaType = "delta"
	// DeltaReset replaces the text shown for the run with Text, and the
	// reasoning shown with Reasoning (none when it is empty): the attempt
	// started over (a model call was retried after part of its reply had
	// streamed), and what streamed since the last good point is void.
	DeltaReset DeltaType = "reset"
	// DeltaReasoning appends Text to the reasoning the run shows: what the
	// model thinks before it answers, shown apart from the reply's text
	// and never part of it.
	DeltaReasoning DeltaType = "reasoning"
	// DeltaDone says the agent finished writing. The reply becomes durable
	// only when the turn's finalize commits it.
	DeltaDone DeltaType = "done"
	// DeltaToolInput says the run calls a tool (ToolCallID, Tool) with
	// Input, its JSON arguments: the call is journaled as started.
	DeltaToolInput DeltaType = "tool_input"
	// DeltaToolOutput says the call ToolCallID completed with Text, its
	// result.
	DeltaToolOutput DeltaType = "tool_output"
	// DeltaToolError says the call ToolCallID failed. Its cause, which
	// may name servers, is in the journal only.
	DeltaToolError DeltaType = "tool_error"
	// DeltaToolDenied says the call ToolCallID was never sent: the person
	// asked to approve it denied it, or its approval expired.
	DeltaToolDenied DeltaType = "tool_denied"
)

// LiveDelta is the body of a live message, one step of the reply a run is
// writing: text, reasoning, or a tool call. Seq starts at 1 and grows by
// one with each event of a run, so a subscriber can tell a gap (core NATS
// may drop messages for a slow consumer) from the end of the stream.
type LiveDelta struct {
	RunID string    `json:"run_id"`
	Seq   int64     `json:"seq"`
	Type  DeltaType `json:"type"`
	Text  string    `json:"text,omitempty"`
	// Reasoning is a reset's: the reasoning that stands.
	Reasoning string `json:"reasoning,omitempty"`
	// ToolCallID names the tool call of a tool_input, tool_output,
	// tool_error or tool_denied; Tool and Input are a tool_input's.
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Tool       string          `json:"tool,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// ParseLiveDelta decodes a live message body.
func ParseLiveDelta(data []byte) (LiveDelta, error) {
	var e LiveDelta
	if err := json.Unmarshal(data, &e); err != nil {
		return LiveDelta{}, fmt.Errorf("nats: live message is not a live delta: %w", err)
	}
	switch e.Type {
	case DeltaText, DeltaReset, DeltaDone, DeltaReasoning:
	case DeltaToolInput, DeltaToolOutput, DeltaToolError, DeltaToolDenied:
		if e.ToolCallID == "" || e.Type == DeltaToolInput && (e.Tool == "" || len(e.Input) == 0) {
			return LiveDelta{}, fmt.Errorf("nats: live delta %s lacks tool_call_id, tool or input: %s", e.Type, data)
		}
	default:
		return LiveDelta{}, fmt.Errorf("nats: live delta has unknown type %q: want delta, reasoning, reset, done, tool_input, tool_output, tool_error or tool_denied", e.Type)
	}
	if e.RunID == "" || e.Seq < 1 {
		return LiveDelta{}, fmt.Errorf("nats: live delta lacks run_id or a positive seq: %s", data)
	}
	return e, nil
}

// LiveText folds the deltas of one run, in sequence order, into the text they
// show.
func LiveText(events []LiveDelta) string {
	var r LiveReply
	for _, e := range events {
		r.Apply(e)
	}
	return r.Text()
}

// LiveReply is the reply of one run as its live deltas show it so far:
// reasoning, text and tool calls in the order they came. It is also the answer to a
// snapshot request (SnapshotSubject): what a client that joins the run
// late shows first, Seq the last delta it folds in. A copy that Apply is
// called on must not be copied again.
type LiveReply struct {
	RunID string     `json:"run_id"`
	Seq   int64      `json:"seq"`
	Parts []LivePart `json:"parts"`
	// Done is set once the agent finished writing (DeltaDone).
	Done bool `json:"done,omitempty"`
	// tail builds the text of the last part while deltas append to it, so
	// that a long reply is not copied whole at each delta.
	tail *strings.Builder
}

// Kinds of LivePart.
const (
	PartText = "text"
	PartTool = "tool"
	// PartReasoning is reasoning: what the model thought before the
	// parts that follow it.
	PartReasoning = "reasoning"
)

// States of a tool call LivePart.
const (
	ToolInputAvailable  = "input-available"
	ToolOutputAvailable = "output-available"
	ToolOutputError     = "output-error"
	ToolOutputDenied    = "output-denied"
)

// LivePart is a piece of a LiveReply: text, reasoning, or a tool call.
type LivePart struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	// A tool call's id, tool, JSON input, state and (output-available)
	// output.
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Tool       string          `json:"tool,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	State      string          `json:"state,omitempty"`
	Output     string          `json:"output,omitempty"`
}

// Apply folds the next delta of the run into r. Text and reasoning
// deltas append to the last part when it is of their kind, and start a
// part of their own otherwise: reasoning comes before the text it
// precedes.
//
// A reset keeps the tool calls where they stand and treats text and
// reasoning alike, each on its own: when the reset's text (reasoning)
// begins the text (reasoning) shown so far, an attempt's model call
// started over from what stood, and the text (reasoning) is cut back to
// it from the end, emptied parts removed; otherwise all of it goes and
// the reset's follows the parts that stay (reasoning first when both are
// replaced). So a reset voids exactly the reasoning shown after the point
// it keeps, as it does the text. A delta of a type Apply does not know
// changes nothing but Seq.
func (r *LiveReply) Apply(d LiveDelta) {
	r.Seq = max(r.Seq, d.Seq)
	if r.RunID == "" {
		r.RunID = d.RunID
	}
	switch d.Type {
	case DeltaText:
		r.appendTo(PartText, d.Text)
	case DeltaReasoning:
		r.appendTo(PartReasoning, d.Text)
	case DeltaReset:
		r.tail = nil
		r.reset(PartReasoning, d.Reasoning)
		r.reset(PartText, d.Text)
	case DeltaDone:
		r.Done = true
	case DeltaToolInput:
		r.tail = nil
		r.Parts = append(r.Parts, LivePart{Type: PartTool, ToolCallID: d.ToolCallID, Tool: d.Tool, Input: d.Input, State: ToolInputAvailable})
	case DeltaToolOutput, DeltaToolError, DeltaToolDenied:
		for i := len(r.Parts) - 1; i >= 0; i-- {
			if p := &r.Parts[i]; p.Type == PartTool && p.ToolCallID == d.ToolCallID {
				switch d.Type {
				case DeltaToolOutput:
					p.State, p.Output = ToolOutputAvailable, d.Text
				case DeltaToolError:
					p.State, p.Output = ToolOutputError, ""
				default:
					p.State, p.Output = ToolOutputDenied, ""
				}
				break
			}
		}
	}
}

// appendTo appends text to the last part when it is of kind, else to a
// new part of kind.
func (r *LiveReply) appendTo(kind, text string) {
	n := len(r.Parts)
	if n == 0 || r.Parts[n-1].Type != kind {
		if text == "" {
			return
		}
		r.Parts, r.tail = append(r.Parts, LivePart{Type: kind}), nil
		n++
	}
	if r.tail == nil {
		r.tail = &strings.Builder{}
		r.tail.WriteString(r.Parts[n-1].Text)
	}
	r.tail.WriteString(text)
	r.Parts[n-1].Text = r.tail.String()
}

// reset makes the parts of kind (text or reasoning) show text: cut back
// to it when it begins what they show, else replaced by it after the
// parts that stay.
func (r *LiveReply) reset(kind, text string) {
	if shown := r.joined(kind); strings.HasPrefix(shown, text) {
		// Cut back to len(text), from the end.
		cut := len(shown) - len(text)
		for i := len(r.Parts) - 1; i >= 0 && cut > 0; i-- {
			p := &r.Parts[i]
			if p.Type != kind {
				continue
			}
			n := min(cut, len(p.Text))
			p.Text = p.Text[:len(p.Text)-n]
			cut -= n
		}
		r.Parts = slices.DeleteFunc(r.Parts, func(p LivePart) bool { return p.Type == kind && p.Text == "" })
		return
	}
	r.Parts = slices.DeleteFunc(r.Parts, func(p LivePart) bool { return p.Type == kind })
	if text != "" {
		r.Parts = append(r.Parts, LivePart{Type: kind, Text: text})
	}
}

// joined is the text of the parts of kind, joined.
func (r LiveReply) joined(kind string) string {
	var b strings.Builder
	for _, p := range r.Parts {
		if p.Type == kind {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// Text is the text the reply shows, its text parts joined: reasoning is
// no part of it.
func (r LiveReply) Text() string { return r.joined(PartText) }

// Reasoning is the reasoning the reply shows, its reasoning parts joined.
func (r LiveReply) Reasoning() string { return r.joined(PartReasoning) }

// SnapshotPrefix is the first tokens of the subjects on which a client that
// joins a run late asks the worker that runs it for the reply so far: a
// request on SnapshotSubject, answered with a LiveReply.
const SnapshotPrefix = "baton.snapshot"

// SnapshotSubject is the subject of the snapshot requests of one run:
// "baton.snapshot.<conversation token>.<run token>", tokens as in
// LiveSubject.
func SnapshotSubject(conversationID, runID string) string {
	return SnapshotPrefix + "." + EncodeToken(conversationID) + "." + runToken(runID)
}

// StopPrefix is the first tokens of the subjects on which the API tells
// the workers that a run was asked to stop, once the stop committed. The
// notice only hurries the run: a worker that misses it sees the stop in
// PostgreSQL at its next lease renewal or finalize.
const StopPrefix = "baton.stop"

// StopSubject is the subject of the stop notice of one run:
// "baton.stop.<conversation token>.<run token>". The notice has no body.
func StopSubject(conversationID, runID string) string {
	return StopPrefix + "." + EncodeToken(conversationID) + "." + runToken(runID)
}

// ParseRunSubject reads the conversation and the run's token (RunToken)
// from a live, snapshot or stop subject under prefix.
func ParseRunSubject(prefix, subject string) (conversationID, runToken string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	conv, run, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || run == "" || strings.Contains(run, ".") {
		return "", "", fmt.Errorf("nats: subject %q is not %s.<conversation>.<run>", subject, prefix)
	}
	if conversationID, err = DecodeToken(conv); err != nil {
		return "", "", err
	}
	return conversationID, run, nil
}

// RunToken is a run id as it is in subjects: as it is when it is a valid
// subject token (Baton's run_<uuid> always is), else in unpadded
// base64url.
func RunToken(runID string) string { return runToken(runID) }

func runToken(runID string) string {
	if !validToken(runID) {
		return EncodeToken(runID)
	}
	return runID
}
