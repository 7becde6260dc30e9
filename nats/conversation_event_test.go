package nats_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestEventPublisherProvisionsALostEventsStreamAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testenv.StartNATS(t).Connect(t)
	cfg := batonnats.EventsConfig{Name: "EV_LOST", SubjectPrefix: "ev.lost"}
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, cfg, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	pub := batonnats.NewEventPublisher(js, cfg, true)
	require.NoError(t, pub.Publish(ctx, batonnats.ConversationEvent{Type: batonnats.EventMessage, ConversationID: "c"}, ""))

	// The broker loses the stream.
	require.NoError(t, js.DeleteStream(ctx, "EV_LOST"))
	require.NoError(t, pub.Publish(ctx, batonnats.ConversationEvent{Type: batonnats.EventReplied, ConversationID: "c"}, ""))
	s, err := js.Stream(ctx, "EV_LOST")
	require.NoError(t, err, "the publisher provisioned the stream again")
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs)
}
