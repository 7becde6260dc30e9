package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestRelayPublishesEveryRowOnceInCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		producers     = 8
		conversations = 40
		rows          = 10_000
	)
	for i := range conversations {
		b.conversation(t, convID(i))
	}
	r, _ := b.start(t, b.cfg)
	waitActive(t, r)

	// Each transaction takes its conversation's row lock before inserting,
	// so within a conversation outbox IDs are in commit order; transactions
	// carry one to three rows, interleaved across producers.
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 1))
			for n := 0; n < rows/producers; {
				batch := min(1+rng.IntN(3), rows/producers-n)
				conv := convID(rng.IntN(conversations))
				err := func() error {
					tx, err := b.pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					if _, err := tx.Exec(ctx, `SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE`, conv); err != nil {
						return err
					}
					for k := range batch {
						if _, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{
							OwnerID: b.owner, ConversationID: conv, MessageID: fmt.Sprintf("m-%d-%d-%d", p, n, k), Content: "hi",
						}); err != nil {
							return err
						}
					}
					return tx.Commit(ctx)
				}()
				if err != nil {
					errs <- err
					return
				}
				n += batch
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	end := currentLSN(t, b.pool)

	waitStreamCount(t, b.js, rows, 2*time.Minute)
	events := streamEvents(t, b.js)
	ids := outboxIDs(t, b.pool)
	require.Len(t, ids, rows)
	requireExactlyOnce(t, events, ids)

	last := map[string]int64{}
	for _, e := range events {
		require.Equal(t, string(batonnats.ReasonInsert), e.Reason)
		require.Equal(t, e.OutboxID, e.Trigger.OutboxID)
		require.Equal(t, e.ConversationID, e.Trigger.ConversationID)
		_, conv, err := batonnats.ParseSubject(batonnats.DefaultSubjectPrefix, e.Subject)
		require.NoError(t, err)
		require.Equal(t, e.ConversationID, conv, "the subject names the event's conversation")
		require.False(t, e.Trigger.CreatedAt.IsZero(), "the trigger carries the row's created_at")
		require.Greater(t, e.OutboxID, last[conv], "conversation %q: outbox row %d is in the stream after row %d, against commit order", conv, e.OutboxID, last[conv])
		last[conv] = e.OutboxID
	}
	// Everything acknowledged is eventually confirmed to the slot.
	waitConfirmedPast(t, b.pool, b.cfg.Slot, end, 30*time.Second)
}
