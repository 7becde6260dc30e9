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
	b.conversation("c")
	b.startWorker(b.testConfig())
	b.send("c", "m1", "before")
	b.settled(30 * time.Second)

	require.NoError(t, b.js.DeleteStream(ctx, b.stream.Name))
	_, err := batonnats.EnsureStream(ctx, b.js, b.stream)
	require.NoError(t, err)

	b.send("c", "m2", "after")
	b.eventually(30*time.Second, func() bool {
		return b.count(`SELECT count(*) FROM agent_outbox WHERE status = 'done'`) == 2
	}, "the message sent after the stream was recreated is answered")
	require.Equal(t, 2, b.count(`SELECT count(*) FROM messages WHERE role = 'assistant'`))
}
