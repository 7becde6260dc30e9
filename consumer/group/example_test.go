package group_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// A program of your own runs a consumer group: its handler sees every
// outbox event once, and writes its effects in the transaction that also
// records the event in the group's inbox, so that a redelivery or a replay
// never applies it twice. The relay is usually its own process (baton
// relay); here it runs beside the group.
func Example_group() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// A database migrated by `baton migrate`, and NATS with JetStream;
	// here fresh ones.
	db := testenv.ExampleDatabase()
	nc, err := natsclient.Connect(testenv.ExampleNATS(), natsclient.ReconnectBufSize(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}

	// The group's own table: messages seen per conversation.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE messages_seen (conversation_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		panic(err)
	}

	// A user's message, written as the API writes it.
	_, alice, err := schema.CreateToken(ctx, db.Pool, "alice")
	if err != nil {
		panic(err)
	}
	if _, _, err := schema.CreateConversation(ctx, db.Pool, alice.ID, "demo", "Demo"); err != nil {
		panic(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{
			OwnerID: alice.ID, ConversationID: "demo", MessageID: "msg-1", Content: "hello, group",
		})
		return err
	}); err != nil {
		panic(err)
	}

	// The relay owns the outbox stream and creates it when it starts; a
	// group reads it as it is, so here it is made first, as the relay
	// makes it.
	if _, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{}, batonnats.ProvisionOptions{}); err != nil {
		panic(err)
	}
	// Slot names are global to a PostgreSQL cluster: one per database.
	rel, err := relay.New(relay.Config{Slot: "example_" + db.Name}, db.Pool, nc)
	if err != nil {
		panic(err)
	}
	settled := make(chan group.Outcome, 1)
	g, err := group.New(group.Config{
		Name: "messages-seen",
		Handler: func(ctx context.Context, tx pgx.Tx, ev group.Event) error {
			// ev.ConversationID is the conversation's key: the same for
			// every event of the conversation, whatever its owner calls it.
			_, err := tx.Exec(ctx, `
				INSERT INTO messages_seen (conversation_id, n) VALUES ($1, 1)
				ON CONFLICT (conversation_id) DO UPDATE SET n = messages_seen.n + 1`, ev.ConversationID)
			return err
		},
		// Called after each event is settled.
		OnSettled: func(ev group.Event, o group.Outcome) {
			select {
			case settled <- o:
			default:
			}
		},
	}, db.Pool, js)
	if err != nil {
		panic(err)
	}
	run, rctx := errgroup.WithContext(ctx)
	run.Go(func() error { return rel.Run(rctx) })
	run.Go(func() error { return g.Run(rctx) })

	select {
	case o := <-settled:
		fmt.Println("event", o)
	case <-rctx.Done():
		panic(run.Wait())
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT n FROM messages_seen`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("messages seen in the conversation:", n)

	stop()
	if err := run.Wait(); err != nil {
		panic(err)
	}
	// Output:
	// event applied
	// messages seen in the conversation: 1
}
