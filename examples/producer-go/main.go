// Command producer-go is a shop's backend that asks Baton's agent about a
// customer's support request: it records the request in its own table and
// sends the message to Baton in the same transaction, so both commit or
// neither does (docs/guides/producing.md). It calls Baton's SQL functions
// with pgx, as a program that does not import Baton would.
//
//	DATABASE_URL=postgres://shop:...@db/baton go run ./examples/producer-go start USER CONVERSATION [TITLE]
//	DATABASE_URL=postgres://shop:...@db/baton go run ./examples/producer-go send USER CONVERSATION MESSAGE_ID TEXT
//
// TEXT "-" reads the text from standard input. USER is the user's name in
// Baton: NAME of `baton token create --user NAME`, or <iss>|<sub> of a user
// who signs in with a JWT.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// start makes the conversation when the user has none of that id.
func start(ctx context.Context, pool *pgxpool.Pool, args []string) (any, error) {
	var res struct {
		ConversationKey string `json:"conversation_key"`
		Existed         bool   `json:"existed"`
	}
	title := ""
	if len(args) > 2 {
		title = args[2]
	}
	err := pool.QueryRow(ctx, `SELECT conversation_key, existed FROM baton_create_conversation($1, $2, $3)`,
		args[0], args[1], title).Scan(&res.ConversationKey, &res.Existed)
	return res, err
}

// send writes the shop's row and the message in one transaction. A retry
// with the same message id and text changes nothing and says existed.
func send(ctx context.Context, pool *pgxpool.Pool, args []string) (any, error) {
	userID, conversationID, messageID, content := args[0], args[1], args[2], args[3]
	if content == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, err
		}
		content = string(b)
	}
	var res struct {
		MessageKey string `json:"message_key"`
		Existed    bool   `json:"existed"`
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT message_key, existed FROM baton_send_message($1, $2, $3, $4)`,
			userID, conversationID, messageID, content).Scan(&res.MessageKey, &res.Existed)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO support_requests (customer, message_id, conversation_id, message_key)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT (customer, message_id) DO NOTHING`, userID, messageID, conversationID, res.MessageKey)
		return err
	})
	return res, err
}

func main() {
	commands := map[string]struct {
		run      func(context.Context, *pgxpool.Pool, []string) (any, error)
		min, max int
	}{"start": {start, 2, 3}, "send": {send, 4, 4}}
	var args []string
	if len(os.Args) > 2 {
		args = os.Args[2:]
	}
	command, ok := commands[""]
	if len(os.Args) > 1 {
		command, ok = commands[os.Args[1]]
	}
	if !ok || len(args) < command.min || len(args) > command.max || os.Getenv("DATABASE_URL") == "" {
		fmt.Fprintln(os.Stderr, "usage: DATABASE_URL=... go run ./examples/producer-go start USER CONVERSATION [TITLE]")
		fmt.Fprintln(os.Stderr, "       DATABASE_URL=... go run ./examples/producer-go send USER CONVERSATION MESSAGE_ID TEXT|-")
		os.Exit(2)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res, err := command.run(ctx, pool, args)
	pool.Close()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		// Baton's errors carry a SQLSTATE of class PB and say what to fix.
		fmt.Fprintf(os.Stderr, "%s: %s\n", pgErr.Code, pgErr.Message)
		os.Exit(1)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}
