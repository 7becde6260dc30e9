package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
)

// TestWorkerRejoinsAStreamRecreatedEmpty: when the stream is lost with its
// consumers and comes back empty (as after losing every NATS node's store),
// the worker creates its consumer again and answers the turns announced
// into the new stream.
func TestWorkerRejoinsAStreamRecreatedEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Conversation("c")
	b.startWorker(b.testConfig())
	b.Send("c", "m1", "before")
	b.settled(30 * time.Second)

	require.NoError(t, b.JS.DeleteStream(ctx, b.Stream.Name))
	_, _, err := batonnats.ProvisionStream(ctx, b.JS, b.Stream, batonnats.ProvisionOptions{})
	require.NoError(t, err)

	b.Send("c", "m2", "after")
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_outbox WHERE status = 'done'`) == 2
	}, "the message sent after the stream was recreated is answered")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
}
