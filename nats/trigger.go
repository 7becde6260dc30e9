package nats

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	natsclient "github.com/nats-io/nats.go"
)

// Header names carried by every outbox event. The values of
// Baton-Conversation-Id and Baton-Message-Id are encoded with
// EncodeHeaderValue; the body holds the same ids as they are.
const (
	HeaderMsgID          = "Nats-Msg-Id"
	HeaderOutboxID       = "Baton-Outbox-Id"
	HeaderConversationID = "Baton-Conversation-Id"
	HeaderMessageID      = "Baton-Message-Id"
	HeaderReason         = "Baton-Reason"
	// HeaderTraceParent carries the W3C trace context of the request that
	// wrote the outbox row, when there was one.
	HeaderTraceParent = "traceparent"
)

// Reason says why an event was published.
type Reason string

const (
	// ReasonInsert is the first announcement of an outbox row.
	ReasonInsert Reason = "insert"
	// ReasonRetry is an announcement by recovery, after rows went back to
	// pending.
	ReasonRetry Reason = "retry"
	// ReasonUserRetry is an announcement of failed rows that a user asked
	// to try again (POST .../retry).
	ReasonUserRetry Reason = "user_retry"
	// ReasonSweep is an announcement by the sweeper, for pending rows that
	// nobody claimed in time.
	ReasonSweep Reason = "sweep"
)

// Trigger is the body of an outbox event. It never carries message content:
// the outbox stores triggers, and the messages table stays the one source of
// what was said. A trigger means "look at this conversation's pending rows".
type Trigger struct {
	OutboxID       int64     `json:"outbox_id"`
	ConversationID string    `json:"conversation_id"`
	MessageID      string    `json:"message_id"`
	CreatedAt      time.Time `json:"created_at"`
	Reason         Reason    `json:"reason"`
	// Announcement distinguishes announcements of one row for JetStream's
	// duplicate window: empty for the first, "a<attempts>" for a retry,
	// "s<unix nanos>" for a sweep, "u<unix nanos>" for a user's retry.
	Announcement string `json:"announcement,omitempty"`
	// TraceParent is the W3C trace context the outbox row kept, carried
	// in the traceparent header (not in the body); empty when none.
	TraceParent string `json:"-"`
}

// MsgID is the JetStream deduplication ID of this announcement: the same
// row announced for the same reason maps to the same ID, so a relay that
// republishes after a crash adds nothing, while a real re-announcement is
// never swallowed by the duplicate window.
func (t Trigger) MsgID() string {
	id := "outbox-" + strconv.FormatInt(t.OutboxID, 10)
	if t.Announcement != "" {
		id += "-" + t.Announcement
	}
	return id
}

// Msg builds the JetStream message for t: the subject of its
// conversation, the headers above, and the trigger as JSON.
func (t Trigger) Msg(prefix string, partitions int) (*natsclient.Msg, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	m := natsclient.NewMsg(Subject(prefix, partitions, t.ConversationID))
	m.Data = body
	m.Header.Set(HeaderMsgID, t.MsgID())
	m.Header.Set(HeaderOutboxID, strconv.FormatInt(t.OutboxID, 10))
	m.Header.Set(HeaderConversationID, EncodeHeaderValue(t.ConversationID))
	m.Header.Set(HeaderMessageID, EncodeHeaderValue(t.MessageID))
	m.Header.Set(HeaderReason, string(t.Reason))
	if t.TraceParent != "" {
		m.Header.Set(HeaderTraceParent, t.TraceParent)
	}
	return m, nil
}

// ParseTrigger decodes an event body.
func ParseTrigger(data []byte) (Trigger, error) {
	var t Trigger
	if err := json.Unmarshal(data, &t); err != nil {
		return Trigger{}, fmt.Errorf("nats: event body is not a trigger: %w", err)
	}
	if t.OutboxID <= 0 || t.ConversationID == "" {
		return Trigger{}, fmt.Errorf("nats: trigger lacks outbox_id or conversation_id: %s", data)
	}
	return t, nil
}
