package schema_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// A service of your own writes a user's message in its own transaction,
// beside its own writes: the message and its outbox row commit together,
// or not at all, and a retry with the same message id writes nothing.
func ExampleInsertMessageTx() {
	ctx := context.Background()
	// A database migrated by `baton migrate`; here a fresh one.
	pool := testenv.ExampleDatabase().Pool

	// The user, and a conversation of theirs.
	_, alice, err := schema.CreateToken(ctx, pool, "alice")
	if err != nil {
		panic(err)
	}
	if _, _, err := schema.CreateConversation(ctx, pool, alice.ID, "demo", "Demo"); err != nil {
		panic(err)
	}

	send := func(conversationID, messageID, content string) (schema.InsertResult, error) {
		var res schema.InsertResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The service's own writes go into tx too.
			var err error
			res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{
				OwnerID: alice.ID, ConversationID: conversationID, MessageID: messageID, Content: content,
			})
			return err
		})
		return res, err
	}

	first, err := send("demo", "msg-1", "hello")
	if err != nil {
		panic(err)
	}
	fmt.Println("stored:", first.Message.ID, *first.Message.Status, "existed:", first.Existed)

	// The client did not hear back and sends the same message again.
	again, err := send("demo", "msg-1", "hello")
	if err != nil {
		panic(err)
	}
	fmt.Println("retry: existed:", again.Existed, "same outbox row:", again.OutboxID == first.OutboxID)

	// The same id with other content is a conflict, and writes nothing.
	_, err = send("demo", "msg-1", "something else")
	fmt.Println("other content:", errors.Is(err, schema.ErrConflict))

	// A conversation alice does not have is not found.
	_, err = send("not-hers", "msg-2", "hello")
	fmt.Println("unknown conversation:", errors.Is(err, schema.ErrNotFound))

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM agent_outbox`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Println("outbox rows:", rows)
	// Output:
	// stored: msg-1 pending existed: false
	// retry: existed: true same outbox row: true
	// other content: true
	// unknown conversation: true
	// outbox rows: 1
}
