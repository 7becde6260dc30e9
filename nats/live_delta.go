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

// DeltaType says what a live delta does to the text a subscriber shows.
type DeltaType string

const (
	// DeltaText appends Text.
	DeltaText DeltaType = "delta"
	// DeltaReset replaces everything shown for the run with Text: the
	// attempt started over (a model call was retried after part of its
	// reply had streamed), and what streamed since the last good point is
	// void.
	DeltaReset DeltaType = "reset"
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
// writing: text, or a tool call. Seq starts at 1 and grows by one with
// each event of a run, so a subscriber can tell a gap (core NATS may drop
// messages for a slow consumer) from the end of the stream.
type LiveDelta struct {
	RunID string    `json:"run_id"`
	Seq   int64     `json:"seq"`
	Type  DeltaType `json:"type"`
	Text  string    `json:"text,omitempty"`
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
	case DeltaText, DeltaReset, DeltaDone:
	case DeltaToolInput, DeltaToolOutput, DeltaToolError, DeltaToolDenied:
		if e.ToolCallID == "" || e.Type == DeltaToolInput && (e.Tool == "" || len(e.Input) == 0) {
			return LiveDelta{}, fmt.Errorf("nats: live delta %s lacks tool_call_id, tool or input: %s", e.Type, data)
		}
	default:
		return LiveDelta{}, fmt.Errorf("nats: live delta has unknown type %q: want delta, reset, done, tool_input, tool_output, tool_error or tool_denied", e.Type)
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
// text and tool calls in the order they came. It is also the answer to a
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
)

// States of a tool call LivePart.
const (
	ToolInputAvailable  = "input-available"
	ToolOutputAvailable = "output-available"
	ToolOutputError     = "output-error"
	ToolOutputDenied    = "output-denied"
)

// LivePart is a piece of a LiveReply: text, or a tool call.
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

// Apply folds the next delta of the run into r. A reset keeps the tool
// calls where they stand: when its text begins the text shown so far
// (an attempt's model call started over from what stood), the text is cut
// back to it; otherwise all text goes and the reset's text follows the
// tool calls.
func (r *LiveReply) Apply(d LiveDelta) {
	r.Seq = max(r.Seq, d.Seq)
	if r.RunID == "" {
		r.RunID = d.RunID
	}
	switch d.Type {
	case DeltaText:
		n := len(r.Parts)
		if n == 0 || r.Parts[n-1].Type != PartText {
			if d.Text == "" {
				return
			}
			r.Parts, r.tail = append(r.Parts, LivePart{Type: PartText}), nil
			n++
		}
		if r.tail == nil {
			r.tail = &strings.Builder{}
			r.tail.WriteString(r.Parts[n-1].Text)
		}
		r.tail.WriteString(d.Text)
		r.Parts[n-1].Text = r.tail.String()
	case DeltaReset:
		r.tail = nil
		r.reset(d.Text)
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

func (r *LiveReply) reset(text string) {
	if shown := r.Text(); strings.HasPrefix(shown, text) {
		// Cut the text back to len(text), from the end.
		cut := len(shown) - len(text)
		for i := len(r.Parts) - 1; i >= 0 && cut > 0; i-- {
			p := &r.Parts[i]
			if p.Type != PartText {
				continue
			}
			n := min(cut, len(p.Text))
			p.Text = p.Text[:len(p.Text)-n]
			cut -= n
		}
		r.Parts = slices.DeleteFunc(r.Parts, func(p LivePart) bool { return p.Type == PartText && p.Text == "" })
		return
	}
	r.Parts = slices.DeleteFunc(r.Parts, func(p LivePart) bool { return p.Type == PartText })
	if text != "" {
		r.Parts = append(r.Parts, LivePart{Type: PartText, Text: text})
	}
}

// Text is the text the reply shows, its text parts joined.
func (r LiveReply) Text() string {
	var b strings.Builder
	for _, p := range r.Parts {
		if p.Type == PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

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
