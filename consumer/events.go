package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
)

var stateEvents = map[State]batonnats.EventType{
	StateProcessing: batonnats.EventProcessing,
	StateReplied:    batonnats.EventReplied,
	StatePending:    batonnats.EventPending,
	StateFailed:     batonnats.EventFailed,
	StateCancelled:  batonnats.EventCancelled,
}

// StatePublisher returns a worker's OnStateChange that publishes every
// committed turn state change as a conversation event for live clients.
func StatePublisher(js jetstream.JetStream, events batonnats.EventsConfig, log zerolog.Logger) func(StateChange) {
	pub := batonnats.NewEventPublisher(js, events)
	return func(s StateChange) {
		typ, ok := stateEvents[s.State]
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// The run and the state identify the change: a republication of
		// the same change within the duplicate window is dropped.
		msgID := fmt.Sprintf("%s-%s-%s", s.RunID, s.State, s.TurnID)
		err := pub.Publish(ctx, batonnats.ConversationEvent{
			Type: typ, ConversationID: s.ConversationID, RunID: s.RunID, TurnID: s.TurnID,
			MessageID: s.MessageID, OutboxIDs: s.OutboxIDs,
		}, msgID)
		if err != nil {
			log.Warn().Err(err).Str("conversation_id", s.ConversationID).Str("state", string(s.State)).Msg("could not publish conversation event")
		}
	}
}
