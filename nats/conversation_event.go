package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the conversation events stream.
const (
	DefaultEventsStream  = "BATON_EVENTS"
	DefaultEventsPrefix  = "baton.events"
	DefaultEventsMaxAge  = 24 * time.Hour
	eventsMaxPerSubject  = 10000
	eventsDuplicateLimit = 2 * time.Minute
)

// EventType names a committed change of a conversation, as clients see it.
type EventType string

const (
	// EventMessage: a user message was stored; its turn is pending.
	EventMessage EventType = "message"
	// EventProcessing: a run claimed the conversation's pending messages.
	EventProcessing EventType = "processing"
	// EventPending: an attempt failed or was recovered; its messages wait
	// for another attempt.
	EventPending EventType = "pending"
	// EventWaiting: the model server asked to wait; the messages wait for
	// another attempt, which starts no sooner than NotBefore.
	EventWaiting EventType = "waiting"
	// EventReplied: a reply was committed.
	EventReplied EventType = "replied"
	// EventFailed: a turn gave up; a visible error message was committed.
	EventFailed EventType = "failed"
	// EventCancelled: the conversation was deleted during a turn.
	EventCancelled EventType = "cancelled"
	// EventStopped: a stop ended a turn, whose reply (MessageID) is what
	// the run had written, marked stopped; or, without a run, settled
	// messages that waited for a turn (OutboxIDs), which no turn answers.
	EventStopped EventType = "stopped"
	// EventDeleted: the conversation was deleted.
	EventDeleted EventType = "deleted"
	// EventWaitingForApproval: the turn stopped at a call that its user
	// must approve or deny (ApprovalID, Tool), before ExpiresAt.
	EventWaitingForApproval EventType = "waiting_for_approval"
	// EventApprovalDecided: the user approved or denied the call, or its
	// time ran out (Decision); the turn goes on.
	EventApprovalDecided EventType = "approval_decided"
)

// ConversationEvent is a committed state change of one conversation. It is
// published only after the transaction that made the change committed: a
// client is never told about something that did not happen. A publish that
// is lost (a crash right after the commit) leaves a client stale, never
// wrong; clients reload the state on reconnect.
type ConversationEvent struct {
	Type           EventType `json:"type"`
	ConversationID string    `json:"conversation_id"`
	RunID          string    `json:"run_id,omitempty"`
	TurnID         string    `json:"turn_id,omitempty"`
	// MessageID is the stored message: the user's (message), the reply
	// (replied, stopped) or the visible error (failed); for processing,
	// the id the turn's reply will have.
	MessageID string  `json:"message_id,omitempty"`
	OutboxIDs []int64 `json:"outbox_ids,omitempty"`
	// NotBefore is when a waiting turn's next attempt may start.
	NotBefore *time.Time `json:"not_before,omitempty"`
	// ApprovalID, Tool and ExpiresAt name the call a turn waits for
	// (waiting_for_approval, approval_decided).
	ApprovalID string     `json:"approval_id,omitempty"`
	Tool       string     `json:"tool,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	// Decision is approved, denied or expired (approval_decided).
	Decision string    `json:"decision,omitempty"`
	At       time.Time `json:"at"`
}

// EventsConfig is the conversation events stream.
type EventsConfig struct {
	// Name of the stream. Defaults to BATON_EVENTS.
	Name string
	// SubjectPrefix; events of a conversation go to "<prefix>.<token>".
	// Defaults to baton.events.
	SubjectPrefix string
	// Replicas of the stream. Defaults to 1.
	Replicas int
	// MaxAge bounds how long a reconnecting client can resume. Defaults to
	// 24 hours.
	MaxAge time.Duration
}

// WithDefaults fills zero fields.
func (c EventsConfig) WithDefaults() EventsConfig {
	if c.Name == "" {
		c.Name = DefaultEventsStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultEventsPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultEventsMaxAge
	}
	return c
}

// Subject returns the events subject of a conversation.
func (c EventsConfig) Subject(conversationID string) string {
	return c.SubjectPrefix + "." + EncodeToken(conversationID)
}

// JetStreamConfig is the events stream's configuration sent to the server.
func (c EventsConfig) JetStreamConfig() jetstream.StreamConfig {
	c = c.WithDefaults()
	return jetstream.StreamConfig{
		Name:              c.Name,
		Description:       "Baton conversation events for live clients",
		Subjects:          []string{c.SubjectPrefix + ".>"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		MaxAge:            c.MaxAge,
		MaxMsgsPerSubject: eventsMaxPerSubject,
		Duplicates:        eventsDuplicateLimit,
		Discard:           jetstream.DiscardOld,
	}
}

// ProvisionEventsStream creates the events stream, or updates it to the
// configured settings, and returns what it changed. Its owner, the API
// (or baton dev), calls it; the workers only publish to it.
func ProvisionEventsStream(ctx context.Context, js jetstream.JetStream, c EventsConfig, o ProvisionOptions) (jetstream.Stream, []StreamChange, error) {
	c = c.WithDefaults()
	if err := ValidatePrefix(c.SubjectPrefix); err != nil {
		return nil, nil, err
	}
	want := c.JetStreamConfig()
	// A new events stream numbers its events from the moment it is made
	// (microseconds since 1970), not from 1: an event id a client kept
	// from a stream that was lost and made again (a broker that lost its
	// store) is then below the new stream's first sequence, and the
	// client is told to reload, instead of resuming after an id that
	// names another event of the new stream and missing what came before
	// it. The ids stay exact in JavaScript (below 2^53) until 2255.
	want.FirstSeq = uint64(time.Now().UnixMicro())
	return provision(ctx, js, want, o)
}

// EventPublisher publishes conversation events after commits.
type EventPublisher struct {
	js    jetstream.JetStream
	cfg   EventsConfig
	owner bool
}

// NewEventPublisher returns a publisher on js. The stream's owner (the
// API) passes owner: it provisions the stream again when the stream was
// lost; anyone else only publishes.
func NewEventPublisher(js jetstream.JetStream, cfg EventsConfig, owner bool) *EventPublisher {
	return &EventPublisher{js: js, cfg: cfg.WithDefaults(), owner: owner}
}

// Msg is the message of ev on its conversation's subject. msgID, when not
// empty, deduplicates a republication of the same change.
func (p *EventPublisher) Msg(ev ConversationEvent, msgID string) (*natsclient.Msg, error) {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	m := natsclient.NewMsg(p.cfg.Subject(ev.ConversationID))
	m.Data = body
	if msgID != "" {
		// msgID may hold an id of any text: encoded, it stays exact and
		// ASCII (EncodeHeaderValue), so two ids never share a dedup slot.
		m.Header.Set(HeaderMsgID, EncodeHeaderValue(msgID))
	}
	return m, nil
}

// Publish sends ev and waits for the stream to store it. msgID, when not
// empty, deduplicates a republication of the same change.
func (p *EventPublisher) Publish(ctx context.Context, ev ConversationEvent, msgID string) error {
	m, err := p.Msg(ev, msgID)
	if err != nil {
		return err
	}
	_, err = p.js.PublishMsg(ctx, m)
	if errors.Is(err, jetstream.ErrNoStreamResponse) && p.owner {
		// The stream is gone (a broker that lost its store): its owner
		// provisions it again and publishes once more, rather than leaving
		// live clients without events until every process restarts.
		if _, _, perr := ProvisionEventsStream(ctx, p.js, p.cfg, ProvisionOptions{}); perr != nil {
			return fmt.Errorf("%w (and provisioning the events stream again failed: %v)", err, perr)
		}
		_, err = p.js.PublishMsg(ctx, m)
	}
	return err
}
