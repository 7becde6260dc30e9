package schema_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// A Go service stores a user message and its outbox row in its own
// transaction, beside whatever else it writes there: both commit, or
// neither does, and a rolled-back message is never announced. The
// message's id is the client's idempotency key: a retry finds the message
// and makes no second turn; the same id for other content is a conflict.
// (Programs in other languages call the SQL producer, baton_send_message:
// docs/guides/producing.md.)
func ExampleInsertMessageTx() {
	ctx := context.Background()
	db, drop, err := testenv.NewDatabase() // a migrated Baton database
	if err != nil {
		panic(err)
	}
	defer drop()
	pool := db.Pool
	_, alice, err := schema.CreateToken(ctx, pool, "alice")
	if err != nil {
		panic(err)
	}
	if _, _, err := schema.CreateConversation(ctx, pool, alice.ID, "demo", "Demo"); err != nil {
		panic(err)
	}

	send := func(content string) (schema.InsertResult, error) {
		var res schema.InsertResult
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The service's own writes go here, in tx.
			var err error
			res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{
				OwnerID: alice.ID, ConversationID: "demo", MessageID: "msg-1", Content: content,
			})
			return err
		})
		return res, err
	}
	first, err := send("hello")
	if err != nil {
		panic(err)
	}
	fmt.Println("stored:", !first.Existed, *first.Message.Status)
	retry, err := send("hello")
	if err != nil {
		panic(err)
	}
	fmt.Println("retry found it:", retry.Existed, retry.OutboxID == first.OutboxID)
	_, err = send("something else")
	fmt.Println("conflict:", errors.Is(err, schema.ErrConflict))
	fmt.Println(err)
	// Output:
	// stored: true pending
	// retry found it: true true
	// conflict: true
	// message id "msg-1" was already used for different content: use a new id for a new message
}
