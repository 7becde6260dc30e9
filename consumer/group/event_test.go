package group

import (
	"context"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// A group's event holds the exact ids of its trigger, whatever they hold,
// and one whose body is broken still names its outbox row, read from the
// encoded headers, so that its dead letter does.
func TestEventOfHoldsTheExactIDsAndABrokenBodyStillNamesItsRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testenv.StartNATS(t).Connect(t)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS_OF", Subjects: []string{"evof.>"}})
	require.NoError(t, err)

	tr := batonnats.Trigger{
		OutboxID: 7, ConversationID: " Ünïcödé a.b*c>d ", MessageID: "100% \tsure ",
		CreatedAt: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), Reason: batonnats.ReasonRetry, Announcement: "a2",
	}
	good, err := tr.Msg("evof", 4)
	require.NoError(t, err)
	broken, err := tr.Msg("evof", 4)
	require.NoError(t, err)
	broken.Data = []byte(`{"outbox_id":`)
	broken.Header.Set(batonnats.HeaderMsgID, "outbox-7-a3") // a message of its own
	for _, m := range []*natsclient.Msg{good, broken} {
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}

	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	batch, err := cons.FetchNoWait(2)
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, msgs, 2)

	ev, err := eventOf("g", msgs[0])
	require.NoError(t, err)
	require.Equal(t, tr, ev.Trigger, "the trigger comes from the body, exactly")
	require.Equal(t, "outbox-7-a2", ev.ID)
	require.NotEqual(t, tr.ConversationID, ev.Header.Get(batonnats.HeaderConversationID), "the header is as published: encoded")

	ev, err = eventOf("g", msgs[1])
	require.Error(t, err, "a body that is not a trigger")
	require.Equal(t, "outbox-7-a3", ev.ID)
	want := tr
	want.CreatedAt, want.Announcement = time.Time{}, "a3"
	require.Equal(t, want, ev.Trigger, "the headers name the row, with the exact ids")
}
