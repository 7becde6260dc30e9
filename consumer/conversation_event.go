package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

// publishTimeout bounds the publication of one conversation event.
const publishTimeout = 2 * time.Second

// EventPublisher returns a worker's OnConversationEvent that publishes
// every committed change of a turn as a conversation event for live
// clients.
func EventPublisher(js jetstream.JetStream, events batonnats.EventsConfig, log zerolog.Logger) func(batonnats.ConversationEvent) {
	pub := batonnats.NewEventPublisher(js, events, false)
	return func(ev batonnats.ConversationEvent) {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		defer cancel()
		// The run, the change and the turn identify it: a republication of
		// the same change within the duplicate window is dropped.
		msgID := fmt.Sprintf("%s-%s-%s", ev.RunID, ev.Type, ev.TurnID)
		if err := pub.Publish(ctx, ev, msgID); err != nil {
			log.Warn().Err(err).Str("conversation_id", ev.ConversationID).Str("event", string(ev.Type)).Msg("could not publish conversation event")
		}
	}
}
