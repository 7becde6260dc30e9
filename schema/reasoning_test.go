package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestFinalizeKeepsTheReasoningWithTheReply: the reasoning a finalize is
// given is stored with the reply (NULL when there is none) and read back
// with it by the REST messages, the chat history and the chat reply;
// finalizes of one batch keep each their own.
func TestFinalizeKeepsTheReasoningWithTheReply(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	var fs []schema.Finalize
	claims := map[string]schema.Claim{}
	for _, c := range []string{"thought", "plain"} {
		b.conversation(t, c)
		b.send(t, c, c+"-m1", "why?")
		cl, err := b.claim(t, c, "run_"+c, time.Minute)
		require.NoError(t, err)
		claims[c] = cl
		f := schema.Finalize{ConversationID: cl.ConversationID, RunID: cl.RunID, TurnID: cl.TurnID, OutboxIDs: cl.OutboxIDs, Content: "Because."}
		if c == "thought" {
			f.Reasoning = "The user asks why; answer briefly."
		}
		fs = append(fs, f)
	}
	for i, r := range schema.FinalizeTurns(ctx, b.db.Pool, fs) {
		require.NoError(t, r.Err, "finalize %d", i)
	}

	var stored *string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT reasoning FROM messages WHERE id = $1`, claims["plain"].ReplyID()).Scan(&stored))
	require.Nil(t, stored, "a reply without reasoning stores NULL")
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT reasoning FROM messages WHERE id = $1`, claims["thought"].ReplyID()).Scan(&stored))
	require.Equal(t, "The user asks why; answer briefly.", *stored)

	for c, want := range map[string]string{"thought": "The user asks why; answer briefly.", "plain": ""} {
		msgs, _, err := schema.ListMessages(ctx, b.db.Pool, b.owner, c, "", 10)
		require.NoError(t, err)
		require.Len(t, msgs, 2)
		require.Empty(t, msgs[0].Reasoning, "the user's message has none")
		require.Equal(t, "Because.", msgs[1].Content, "%s: the reasoning is no part of the content", c)
		require.Equal(t, want, msgs[1].Reasoning, c)

		hist, _, err := schema.ChatHistory(ctx, b.db.Pool, b.owner, c, "", 10)
		require.NoError(t, err)
		require.Len(t, hist, 2)
		require.Equal(t, want, hist[1].Reasoning, c)

		reply, err := schema.ChatReply(ctx, b.db.Pool, b.key(c), claims[c].ReplyID())
		require.NoError(t, err)
		require.Equal(t, want, reply.Reasoning, c)
		require.Equal(t, "Because.", reply.Content)
	}
}
