package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// Limits of a worker's event publication.
const (
	// publishTimeout bounds how long the stream may take to store one
	// conversation event.
	publishTimeout = 2 * time.Second
	// publishMaxPending bounds the events sent and not yet stored: past
	// it a publication waits (at most stallWait), then is dropped with a
	// warning, so that a broker that stopped answering costs bounded
	// memory and never stops a turn.
	publishMaxPending = 4096
	publishStallWait  = 200 * time.Millisecond
	// EventFlushTimeout is how long a stopping worker waits for the
	// stream to store the events it sent last (EventPublisher.Stop).
	EventFlushTimeout = publishTimeout
)

// EventPublisher publishes a worker's conversation events for live
// clients, without waiting on the turn: its Publish, a worker's
// OnConversationEvent, sends the event and returns, and the stream's
// acknowledgement is awaited in the background. The events of one
// conversation are published from one goroutine in the order of their
// commits, and one connection keeps that order to the stream. A
// publication the stream did not store is logged, as a late one was.
type EventPublisher struct {
	pub *batonnats.EventPublisher
	js  jetstream.JetStream
	log zerolog.Logger
}

// EventPublisherConfig configures an EventPublisher. It holds settings
// only: the JetStream context comes to NewEventPublisher.
type EventPublisherConfig struct {
	// Events is the conversation events stream. Defaults to
	// nats.EventsConfig's defaults.
	Events batonnats.EventsConfig
	// Logger receives the publications the stream did not store. Defaults
	// to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy with every zero field set to its default.
func (c EventPublisherConfig) WithDefaults() EventPublisherConfig {
	c.Events = c.Events.WithDefaults()
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// NewEventPublisher returns a publisher of events to the events stream
// over js's connection, which the caller owns.
func NewEventPublisher(cfg EventPublisherConfig, js jetstream.JetStream) (*EventPublisher, error) {
	if js == nil {
		return nil, errors.New("consumer: the JetStream context is nil: give NewEventPublisher one (jetstream.New of a NATS connection)")
	}
	cfg = cfg.WithDefaults()
	p := &EventPublisher{log: *cfg.Logger}
	ajs, err := jetstream.New(js.Conn(),
		jetstream.WithPublishAsyncMaxPending(publishMaxPending),
		jetstream.WithPublishAsyncTimeout(publishTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *natsclient.Msg, err error) {
			p.log.Warn().Err(err).Str("subject", m.Subject).Msg("could not publish conversation event")
		}))
	if err != nil {
		return nil, fmt.Errorf("consumer: event publisher: %w", err)
	}
	p.js = ajs
	p.pub = batonnats.NewEventPublisher(ajs, cfg.Events, false)
	return p, nil
}

// Publish sends a committed change of a conversation's turn; it is a
// worker's OnConversationEvent.
func (p *EventPublisher) Publish(ev batonnats.ConversationEvent) {
	// The run, the change and the turn identify it: a republication of
	// the same change within the duplicate window is dropped.
	m, err := p.pub.Msg(ev, fmt.Sprintf("%s-%s-%s", ev.RunID, ev.Type, ev.TurnID))
	if err == nil {
		_, err = p.js.PublishMsgAsync(m, jetstream.WithStallWait(publishStallWait))
	}
	if err != nil {
		p.log.Warn().Err(err).Str("conversation_id", ev.ConversationID).Str("event", string(ev.Type)).Msg("could not publish conversation event")
	}
}

// Stop waits up to EventFlushTimeout for the stream to answer the events
// sent last, before the connection closes, and logs what it did not
// confirm. A worker calls it after Run returned.
func (p *EventPublisher) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), EventFlushTimeout)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		p.log.Warn().Err(err).Msg("conversation events not confirmed at shutdown")
	}
}

// Flush waits until the stream has answered every event sent, or ctx ends.
func (p *EventPublisher) Flush(ctx context.Context) error {
	select {
	case <-p.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("consumer: %d conversation events still unacknowledged: %w", p.js.PublishAsyncPending(), ctx.Err())
	}
}
