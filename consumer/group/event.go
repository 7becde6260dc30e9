package group

import (
	"strconv"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	batonnats "github.com/batonhq/baton/nats"
)

// Event is one outbox event as a consumer group sees it: the trigger the
// relay published, where it sits in the stream, and its identity.
//
// ID is what a group deduplicates on, in its inbox and downstream (the
// webhook sends it to receivers). It is the event's Nats-Msg-Id, the
// announcement's own name ("outbox-<id>" for an insert, "outbox-<id>-a<n>"
// for a retry, "outbox-<id>-s<nanos>" for a sweep), and not the stream
// sequence, because:
//
//   - a replay delivers the same stream message again, with the same
//     Nats-Msg-Id: deduplicated, as it must be;
//   - a relay that republishes an event after its duplicate window (NATS away
//     for longer than the window, the first PubAck lost) stores a second
//     message under a new sequence but the same Nats-Msg-Id: one event, and
//     the inbox sees that;
//   - a stream that is deleted and provisioned again restarts its sequences
//     at 1: keyed on sequences, every new event would look applied already
//     and be skipped without a trace.
//
// A re-announcement of a row (retry, sweep) is a different event with its
// own ID, and each group sees it. A group that cares about rows rather than
// announcements (one notification per message) dedups on Trigger.OutboxID
// in its own tables. A message without a Nats-Msg-Id (not published by the
// relay) is named "<stream>-seq-<sequence>".
type Event struct {
	batonnats.Trigger
	// ID identifies the event for deduplication (see above).
	ID string
	// Group is the consumer group handling the event.
	Group string
	// Stream and StreamSeq place the event in the outbox stream.
	Stream    string
	StreamSeq uint64
	// Subject is "<prefix>.<partition>.<conversation token>".
	Subject string
	// Header holds the relay's headers (Nats-Msg-Id, Baton-*) as
	// published: Baton-Conversation-Id and Baton-Message-Id are encoded
	// (batonnats.DecodeHeaderValue reads them, batonnats.TriggerOfHeader
	// all of them). The embedded Trigger holds the exact ids.
	Header natsclient.Header
	// PublishedAt is when the stream stored the event.
	PublishedAt time.Time
	// Attempt counts deliveries of the event to this group, this one
	// included; a replay starts it again at 1.
	Attempt int
	// Data is the raw event body.
	Data []byte
}

// eventOf reads a delivered message. A body that is not a trigger comes
// back as an error with the event's identity filled in, so the message can
// be parked under its ID, and with the trigger its headers name, when they
// name one, so the dead letter names its outbox row.
func eventOf(group string, msg jetstream.Msg) (Event, error) {
	ev := Event{Group: group, Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(), Attempt: 1}
	md, err := msg.Metadata()
	if err != nil {
		return ev, err
	}
	ev.Stream = md.Stream
	ev.StreamSeq = md.Sequence.Stream
	ev.PublishedAt = md.Timestamp
	ev.Attempt = int(md.NumDelivered)
	ev.ID = msg.Headers().Get(batonnats.HeaderMsgID)
	if ev.ID == "" {
		ev.ID = md.Stream + "-seq-" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	return ev, ev.readTrigger()
}

// readTrigger fills the trigger from the body, or when the body is not one
// from the headers (and returns the body's error), so that a dead letter
// names its outbox row.
func (ev *Event) readTrigger() error {
	t, err := batonnats.ParseTrigger(ev.Data)
	if err != nil {
		if ht, herr := batonnats.TriggerOfHeader(ev.Header); herr == nil {
			ev.Trigger = ht
		}
		return err
	}
	ev.Trigger = t
	return nil
}
