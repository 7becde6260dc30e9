package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// Publish returns without waiting for the stream; Flush waits until the
// stream stored every event sent, each once on its conversation's subject
// (a republication of the same change is dropped).
func TestTheEventPublisherStoresEveryEventOnceByTheTimeFlushReturns(t *testing.T) {
	n := testenv.StartNATS(t)
	_, js := n.Connect(t)
	cfg := batonnats.EventsConfig{Name: "EVENTS_PUB", SubjectPrefix: "eventspub"}.WithDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, _, err := batonnats.ProvisionEventsStream(ctx, js, cfg, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	var logs testenv.SyncBuffer
	log := zerolog.New(&logs)
	p, err := NewEventPublisher(EventPublisherConfig{Events: cfg, Logger: &log}, js)
	require.NoError(t, err)

	const count = 200
	for i := range count {
		p.Publish(batonnats.ConversationEvent{Type: batonnats.EventReplied, ConversationID: fmt.Sprintf("c%d", i%10), RunID: fmt.Sprintf("run%d", i), TurnID: "t"})
	}
	// The same change again: deduplicated by the stream.
	p.Publish(batonnats.ConversationEvent{Type: batonnats.EventReplied, ConversationID: "c0", RunID: "run0", TurnID: "t"})
	require.NoError(t, p.Flush(ctx))
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, count, info.State.Msgs, "every event stored once")
	last, err := stream.GetLastMsgForSubject(ctx, cfg.Subject("c9"))
	require.NoError(t, err)
	require.Contains(t, string(last.Data), `"run_id":"run199"`)
	require.Empty(t, logs.String(), "nothing failed")
}

// A stream that does not answer (here: none) costs the turn nothing: the
// publication fails in the background and is logged, and Flush returns.
func TestAnEventTheStreamDidNotStoreIsLoggedAndDoesNotHoldUpFlush(t *testing.T) {
	n := testenv.StartNATS(t)
	_, js := n.Connect(t)
	cfg := batonnats.EventsConfig{Name: "EVENTS_NONE", SubjectPrefix: "eventsnone"}.WithDefaults()
	var logs testenv.SyncBuffer
	log := zerolog.New(&logs)
	p, err := NewEventPublisher(EventPublisherConfig{Events: cfg, Logger: &log}, js)
	require.NoError(t, err)

	p.Publish(batonnats.ConversationEvent{Type: batonnats.EventReplied, ConversationID: "c1", RunID: "run1", TurnID: "t"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Flush(ctx), "an answered failure is no pending event")
	require.Contains(t, logs.String(), "could not publish conversation event")
	require.Contains(t, logs.String(), cfg.Subject("c1"))
}
