package schema_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestTheGoProducerAnswersEachProducerErrorAsItsKind: InsertMessageTx and
// CreateConversation go through the SQL functions, and each error those
// raise comes back as a *schema.ProducerError with its SQLSTATE and its
// message, which errors.Is finds as ErrNotFound, ErrConflict, ErrInvalid
// or ErrContentTooLarge (so the API's answers stay what they were), and
// which has written nothing.
func TestTheGoProducerAnswersEachProducerErrorAsItsKind(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c1")
	b.conversation(t, "c2")
	b.send(t, "c1", "m1", "hello")
	count := func() string {
		var c, m, o int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM conversations), (SELECT count(*) FROM messages), (SELECT count(*) FROM agent_outbox)`).Scan(&c, &m, &o))
		return fmt.Sprintf("%d conversations, %d messages, %d outbox rows", c, m, o)
	}
	before := count()
	send := func(conversation, message, content string) error {
		return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: b.owner, ConversationID: conversation, MessageID: message, Content: content})
			return err
		})
	}
	create := func(id, title string) error {
		_, _, err := schema.CreateConversation(ctx, b.db.Pool, b.owner, id, title)
		return err
	}
	for _, tc := range []struct {
		what, code string
		kind       error
		err        error
		message    string
	}{
		{"an unknown conversation", schema.SQLStateUnknownConversation, schema.ErrNotFound, send("nope", "m2", "x"), `no conversation "nope" for this user`},
		{"other content", schema.SQLStateConflict, schema.ErrConflict, send("c1", "m1", "bye"), `message id "m1" was already used for different content: use a new id for a new message`},
		{"another conversation", schema.SQLStateConflict, schema.ErrConflict, send("c2", "m1", "hello"), `message id "m1" was already used in conversation "c1"`},
		{"a bad conversation id", schema.SQLStateBadConversationID, schema.ErrInvalid, send("c1 ", "m2", "x"), `conversation id "c1 " starts or ends with whitespace: remove it`},
		{"a bad message id", schema.SQLStateBadMessageID, schema.ErrInvalid, send("c1", strings.Repeat("m", 201), "x"), "message id is 201 characters long: the limit is 200"},
		{"empty content", schema.SQLStateEmptyContent, schema.ErrInvalid, send("c1", "m2", ""), "content is empty"},
		{"content over the bound", schema.SQLStateContentTooLarge, schema.ErrContentTooLarge, send("c1", "m2", strings.Repeat("ü", schema.MaxContentBytes/2+1)),
			fmt.Sprintf("content is %d bytes: the limit is %d bytes", schema.MaxContentBytes+2, schema.MaxContentBytes)},
		{"a bad new conversation id", schema.SQLStateBadConversationID, schema.ErrInvalid, create("", "t"), "conversation id is empty: give 1 to 200 characters"},
		{"a long title", schema.SQLStateBadTitle, schema.ErrInvalid, create("c3", strings.Repeat("t", schema.MaxTitleLength+1)), "title is 501 characters long: the limit is 500"},
	} {
		var pe *schema.ProducerError
		require.True(t, errors.As(tc.err, &pe), "%s: want a *schema.ProducerError, got %v", tc.what, tc.err)
		require.Equal(t, tc.code, pe.Code, tc.what)
		require.ErrorIs(t, tc.err, tc.kind, tc.what)
		require.Contains(t, tc.err.Error(), tc.message, tc.what)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(tc.err, &pgErr), "%s: the driver's error is still in the chain", tc.what)
		require.Equal(t, before, count(), "%s writes nothing", tc.what)
	}
}

// TestGoAndSQLHoldIdsToTheSameRules: schema.ValidateID, which the API
// applies before it calls the database, accepts exactly the ids the SQL
// producer's baton_check_id accepts: every control character and every
// Unicode space at the start, in the middle and at the end, lengths
// around the bound, and the ids that FuzzValidateID starts from.
func TestGoAndSQLHoldIdsToTheSameRules(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	ids := []string{"demo", "", "a.b*c> d", "ünï 漢字", "x", strings.Repeat("x", 200), strings.Repeat("x", 201),
		strings.Repeat("ü", 200), strings.Repeat("ü", 201), `it's "q"; --`, ".", "..", "...", " .", "a/../b", "reply_1", "error_x"}
	for r := rune(1); r <= 0x3000; r++ {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			ids = append(ids, string(r)+"a", "a"+string(r)+"b", "a"+string(r), string(r))
		}
	}
	for _, id := range ids {
		_, sqlErr := db.Pool.Exec(ctx, `SELECT baton_check_id('conversation', $1)`, id)
		goErr := schema.ValidateID("conversation", id)
		require.Equal(t, goErr == nil, sqlErr == nil, "id %q: Go says %v, SQL says %v", id, goErr, sqlErr)
		if goErr != nil {
			var pgErr *pgconn.PgError
			require.True(t, errors.As(sqlErr, &pgErr))
			require.Equal(t, schema.SQLStateBadConversationID, pgErr.Code, "id %q", id)
			if !strings.Contains(goErr.Error(), "whitespace") {
				require.Equal(t, goErr.Error(), pgErr.Message, "id %q: the same words in Go and SQL", id)
			}
		}
	}
	// A message id may not take a prefix of the server's own messages.
	for _, id := range []string{"reply_1", "error_x", "reply_", "m1", "replyx", "a reply_1"} {
		_, sqlErr := db.Pool.Exec(ctx, `SELECT baton_check_id('message', $1)`, id)
		goErr := schema.ValidateID("message", id)
		require.Equal(t, goErr == nil, sqlErr == nil, "message id %q: Go says %v, SQL says %v", id, goErr, sqlErr)
		if goErr != nil {
			require.ErrorIs(t, goErr, schema.ErrReservedID)
			require.ErrorIs(t, goErr, schema.ErrInvalid)
			var pgErr *pgconn.PgError
			require.True(t, errors.As(sqlErr, &pgErr))
			require.Equal(t, schema.SQLStateReservedMessageID, pgErr.Code, "message id %q", id)
			require.Equal(t, goErr.Error(), pgErr.Message, "message id %q: the same words in Go and SQL", id)
		}
	}
}

// TestTheSQLProducerMakesAUserOnlyWhenItCreatesAConversation: a user
// Baton does not know is made by baton_create_conversation, as a JWT makes
// one on first sight, and found again by the same name afterwards;
// baton_send_message for an unknown user is PB010 and makes nobody. A user
// id the users table cannot hold, whatever its bound, is PB001.
func TestTheSQLProducerMakesAUserOnlyWhenItCreatesAConversation(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	users := func() int { return testenv.Count(t, db.Pool, `SELECT count(*) FROM users`) }
	code := func(err error) string {
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "want a PostgreSQL error, got %v", err)
		return pgErr.Code
	}

	_, err := db.Pool.Exec(ctx, `SELECT * FROM baton_send_message('https://issuer.example|user-1', 'c', 'm', 'x')`)
	require.Equal(t, schema.SQLStateUnknownConversation, code(err))
	require.Zero(t, users(), "sending for an unknown user makes no user")

	var existed bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT existed FROM baton_create_conversation('https://issuer.example|user-1', 'c', '')`).Scan(&existed))
	require.False(t, existed)
	_, token, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT existed FROM baton_create_conversation('alice', 'c', '')`).Scan(&existed))
	require.False(t, existed, "alice's conversation c is not the other user's")
	require.Equal(t, 2, users(), "the JWT-style user was made once; alice, of baton token create, was found by her name")
	c, err := schema.GetConversation(ctx, db.Pool, token.ID, "c")
	require.NoError(t, err, "the SQL producer's conversation is the conversation alice reads through the API")
	require.Equal(t, "c", c.ID)

	// Whatever bound the users table holds names to, a longer user id is
	// the producer's own error, not the table's check.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE users ADD CONSTRAINT users_name_short CHECK (length(name) <= 20) NOT VALID`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT * FROM baton_create_conversation($1, 'c', '')`, strings.Repeat("u", 21))
	require.Equal(t, schema.SQLStateBadUserID, code(err))
	require.ErrorContains(t, err, "longer than this database's users table takes")
	require.Equal(t, 2, users())
}
