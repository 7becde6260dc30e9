package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestEachRoleCanDoWhatFilesNeed runs what attachments need of the
// database, each as the role of the component that does it: the API
// stores a message with a file, matches a file sent before, lists and
// serves files and signs links as baton_api; the worker claims a turn
// with its files, reads their bytes and signs links as baton_worker; the
// relay's prune sweeps files as baton_relay; and a conversation deleted
// by the API removes the files no other message references.
func TestEachRoleCanDoWhatFilesNeed(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	admin, api, worker, relayDB := d.pool(t, "admin"), d.pool(t, "api"), d.pool(t, "worker"), d.pool(t, "relay")
	token, _, err := schema.CreateTokenUntil(ctx, admin, "alice", time.Now().Add(time.Hour))
	require.NoError(t, err)
	user, err := schema.Authenticate(ctx, api, token)
	require.NoError(t, err)
	conv, _, err := schema.CreateConversation(ctx, api, user.ID, "files", "")
	require.NoError(t, err)
	note := []byte("a note\n")
	var first schema.InsertResult
	inTx(t, api, "InsertMessageTx with a file as baton_api", func(tx pgx.Tx) error {
		first, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "files", MessageID: "m1", Content: "read it",
			Files: []schema.FileIn{{Filename: "note.txt", MediaType: "text/plain", Data: note}}})
		return err
	})
	sum := first.Message.Files[0].SHA256
	inTx(t, api, "InsertMessageTx with a file sent before as baton_api", func(tx pgx.Tx) error {
		_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "files", MessageID: "m2",
			Files: []schema.FileIn{{Filename: "note.txt", SHA256: sum}}})
		return err
	})
	msgs, _, err := schema.ListMessages(ctx, api, user.ID, "files", "", 10)
	require.NoError(t, err, "ListMessages as baton_api")
	require.Len(t, msgs[0].Files, 1)
	_, _, err = schema.ChatHistory(ctx, api, user.ID, "files", "", 10)
	require.NoError(t, err, "ChatHistory as baton_api")
	f, err := schema.PostgresFiles{}.Open(ctx, api, user.ID, sum)
	require.NoError(t, err, "open a file as baton_api")
	require.Equal(t, note, f.Data)
	_, err = schema.LoadFileLinks(ctx, api)
	require.NoError(t, err, "the links' key as baton_api")

	c, in, err := schema.ClaimTurn(ctx, worker, schema.ClaimParams{ConversationID: conv.Key, RunID: "run_1", Worker: "w1", Lease: time.Minute, MaxAttempts: 3, MaxRows: 20}, 10)
	require.NoError(t, err, "ClaimTurn as baton_worker")
	require.False(t, c.Empty())
	require.Len(t, in.Messages[0].Files, 1, "the claim loads the turn's files")
	f, err = schema.OpenMessageFile(ctx, worker, schema.PostgresFiles{}, in.Messages[0].Key, sum)
	require.NoError(t, err, "OpenMessageFile as baton_worker")
	require.Equal(t, note, f.Data)
	_, err = schema.LoadFileLinks(ctx, worker)
	require.NoError(t, err, "the links' key as baton_worker")

	_, err = schema.PruneFiles(ctx, relayDB, 10)
	require.NoError(t, err, "PruneFiles as baton_relay")

	_, err = schema.DeleteConversation(ctx, api, user.ID, "files")
	require.NoError(t, err, "DeleteConversation as baton_api")
	var left int
	require.NoError(t, d.superuser(t).QueryRow(ctx, `SELECT (SELECT count(*) FROM files) + (SELECT coalesce(sum(bytes), 0) FROM file_usage)`).Scan(&left))
	require.Zero(t, left, "the conversation's file went with it, and its bytes")
}
