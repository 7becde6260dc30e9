package nats

import (
	"encoding/json"
	"fmt"
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
	if !validToken(runID) {
		runID = EncodeToken(runID)
	}
	return LivePrefix + "." + EncodeToken(conversationID) + "." + runID
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
)

// LiveDelta is the body of a live message, one step of the text a run is
// writing. Seq starts at 1 and grows by
// one with each event of a run, so a subscriber can tell a gap (core NATS
// may drop messages for a slow consumer) from the end of the stream.
type LiveDelta struct {
	RunID string    `json:"run_id"`
	Seq   int64     `json:"seq"`
	Type  DeltaType `json:"type"`
	Text  string    `json:"text,omitempty"`
}

// ParseLiveDelta decodes a live message body.
func ParseLiveDelta(data []byte) (LiveDelta, error) {
	var e LiveDelta
	if err := json.Unmarshal(data, &e); err != nil {
		return LiveDelta{}, fmt.Errorf("nats: live message is not a live delta: %w", err)
	}
	switch e.Type {
	case DeltaText, DeltaReset, DeltaDone:
	default:
		return LiveDelta{}, fmt.Errorf("nats: live delta has unknown type %q: want delta, reset or done", e.Type)
	}
	if e.RunID == "" || e.Seq < 1 {
		return LiveDelta{}, fmt.Errorf("nats: live delta lacks run_id or a positive seq: %s", data)
	}
	return e, nil
}

// LiveText folds the deltas of one run, in sequence order, into the text they
// show.
func LiveText(events []LiveDelta) string {
	var b strings.Builder
	for _, e := range events {
		switch e.Type {
		case DeltaText:
			b.WriteString(e.Text)
		case DeltaReset:
			b.Reset()
			b.WriteString(e.Text)
		}
	}
	return b.String()
}
