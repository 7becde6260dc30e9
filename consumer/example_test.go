package consumer_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// shout is an agent: its one step answers a turn's messages in capitals.
// A real one calls a model (package agent), and may ask for tools, which
// the turn runner journals and runs before it asks for the next step.
type shout struct{}

func (shout) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	var parts []string
	for _, m := range req.Turn.Messages {
		parts = append(parts, strings.ToUpper(m.Content))
	}
	return consumer.Step{Text: strings.Join(parts, " ")}, nil
}

// A program of your own runs Baton's turn runner with an agent of its
// own. The relay, which publishes outbox rows to the stream, is usually
// its own process (baton relay); here it runs beside the worker.
func Example_worker() {
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
			OwnerID: alice.ID, ConversationID: "demo", MessageID: "msg-1", Content: "hello, worker",
		})
		return err
	}); err != nil {
		panic(err)
	}

	// The relay owns the outbox stream and creates it when it starts; a
	// worker reads it as it is, so here it is made first, as the relay
	// makes it.
	if _, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{}, batonnats.ProvisionOptions{}); err != nil {
		panic(err)
	}
	// Slot names are global to a PostgreSQL cluster: one per database.
	rel, err := relay.New(relay.Config{Slot: "example_" + db.Name}, db.Pool, nc)
	if err != nil {
		panic(err)
	}
	replied := make(chan batonnats.ConversationEvent, 1)
	worker, err := consumer.New(consumer.Config{
		Agent: shout{},
		// Called after each committed change of a conversation's turn.
		OnConversationEvent: func(ev batonnats.ConversationEvent) {
			if ev.Type == batonnats.EventReplied {
				select {
				case replied <- ev:
				default:
				}
			}
		},
	}, db.Pool, js)
	if err != nil {
		panic(err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return rel.Run(gctx) })
	g.Go(func() error { return worker.Run(gctx) })

	select {
	case <-replied:
	case <-gctx.Done():
		panic(g.Wait())
	}
	msgs, _, err := schema.ListMessages(ctx, db.Pool, alice.ID, "demo", "", 10)
	if err != nil {
		panic(err)
	}
	for _, m := range msgs {
		fmt.Printf("%s: %s\n", m.Role, m.Content)
	}

	stop()
	if err := g.Wait(); err != nil {
		panic(err)
	}
	// Output:
	// user: hello, worker
	// assistant: HELLO, WORKER
}
