package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// chosenByTheServer are the columns whose values the server chooses on its
// own for each row, which two databases never share: keys (and the columns
// that hold another row's key), sequence values and times. They are
// compared by kind only: a key by its prefix, anything else by whether it
// is set. Every other column, including any a later migration adds, must
// be equal.
var chosenByTheServer = map[string]map[string]bool{
	"users":         {"id": true, "created_at": true},
	"conversations": {"id": true, "owner_id": true, "created_at": true, "updated_at": true, "last_message_at": true, "id_salt": true},
	"messages":      {"id": true, "owner_id": true, "conversation_id": true, "seq": true, "created_at": true},
	"agent_outbox":  {"id": true, "conversation_id": true, "message_id": true, "created_at": true},
}

// rowsOfAlice returns alice's rows of a table, as JSON objects with the
// server's choices reduced to their kind.
func rowsOfAlice(t *testing.T, pool *pgxpool.Pool, table string) []map[string]any {
	t.Helper()
	where := map[string]string{
		"users":         `name = 'alice'`,
		"conversations": `owner_id = (SELECT id FROM users WHERE name = 'alice')`,
		"messages":      `conversation_id IN (SELECT c.id FROM conversations c JOIN users u ON u.id = c.owner_id WHERE u.name = 'alice')`,
		"agent_outbox":  `conversation_id IN (SELECT c.id FROM conversations c JOIN users u ON u.id = c.owner_id WHERE u.name = 'alice')`,
	}[table]
	rows, err := pool.Query(context.Background(), `SELECT row_to_json(r)::text FROM `+table+` r WHERE `+where+` ORDER BY 1`)
	require.NoError(t, err)
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, texts, "alice has rows in %s", table)
	out := make([]map[string]any, 0, len(texts))
	for _, text := range texts {
		row := map[string]any{}
		require.NoError(t, json.Unmarshal([]byte(text), &row))
		for column := range chosenByTheServer[table] {
			v, ok := row[column]
			require.True(t, ok, "%s has a column %s", table, column)
			switch v := v.(type) {
			case nil:
				row[column] = "<null>"
			case string:
				if prefix, _, found := strings.Cut(v, "_"); found && (prefix == "c" || prefix == "m") {
					row[column] = "<key " + prefix + "_>"
				} else {
					row[column] = "<set>"
				}
			default:
				row[column] = "<set>"
			}
		}
		out = append(out, row)
	}
	return out
}

// TestTheSQLProducerWritesTheRowsTheAPIWrites writes the same conversation
// and message twice, into two databases: through the API, for a user of
// `baton token create --user alice`, and through the SQL producer's
// baton_create_conversation and baton_send_message for the user id
// "alice", whom the function makes. Alice's rows of users, conversations,
// messages and agent_outbox are the same column for column, ignoring only
// what the server chooses on its own (chosenByTheServer: keys, sequence
// values and times, compared by their kind).
func TestTheSQLProducerWritesTheRowsTheAPIWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	viaAPI := testenv.Database(t)
	token, _, err := schema.CreateToken(ctx, viaAPI.Pool, "alice")
	require.NoError(t, err)
	s, err := api.New(api.Config{}, viaAPI.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	b := &bundle{pool: viaAPI.Pool, srv: hs, client: hs.Client()}
	r := b.do(t, token, "POST", "/v1/conversations", map[string]any{"id": "demo ü;'", "title": `Demo "one"`})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	r = b.do(t, token, "POST", convPath("demo ü;'", "/messages"), map[string]any{"id": "msg-1 ö\"", "content": "hello\n\tworld; 'ü' 😀"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)

	viaSQL := testenv.Database(t)
	require.NoError(t, pgx.BeginFunc(ctx, viaSQL.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT * FROM baton_create_conversation('alice', $1, $2)`, "demo ü;'", `Demo "one"`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT * FROM baton_send_message('alice', $1, $2, $3)`, "demo ü;'", "msg-1 ö\"", "hello\n\tworld; 'ü' 😀")
		return err
	}))

	for _, table := range []string{"users", "conversations", "messages", "agent_outbox"} {
		require.Equal(t, rowsOfAlice(t, viaAPI.Pool, table), rowsOfAlice(t, viaSQL.Pool, table),
			"%s: the SQL producer's rows are the API's, column for column (keys, sequence values and times aside)", table)
	}
}
