package schema_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestTwoOwnersUseTheSameIdsWithoutMeeting: conversation and message ids
// are per owner. Two users create "demo" and post "m1" to it; each gets
// their own conversation, message and outbox row, under keys that differ,
// and neither sees the other's.
func TestTwoOwnersUseTheSameIdsWithoutMeeting(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	_, other, err := schema.CreateToken(ctx, b.db.Pool, "other")
	require.NoError(t, err)

	mine, created, err := schema.CreateConversation(ctx, b.db.Pool, b.owner, "demo", "mine")
	require.NoError(t, err)
	require.True(t, created)
	theirs, created, err := schema.CreateConversation(ctx, b.db.Pool, other.ID, "demo", "theirs")
	require.NoError(t, err)
	require.True(t, created, "the same id for another owner is another conversation, not a conflict")
	require.NotEqual(t, mine.Key, theirs.Key)
	require.Equal(t, "demo", theirs.ID)

	insert := func(owner int64, content string) schema.InsertResult {
		var res schema.InsertResult
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: owner, ConversationID: "demo", MessageID: "m1", Content: content})
			return err
		}))
		return res
	}
	a := insert(b.owner, "hello from me")
	o := insert(other.ID, "hello from them")
	require.False(t, a.Existed)
	require.False(t, o.Existed, "another owner's message of the same id is a new message")
	require.NotEqual(t, a.MessageKey, o.MessageKey)
	require.Equal(t, mine.Key, a.ConversationKey)
	require.Equal(t, theirs.Key, o.ConversationKey)

	again := insert(b.owner, "hello from me")
	require.True(t, again.Existed, "my retry is recognized")
	require.Equal(t, a.OutboxID, again.OutboxID)

	msgs, _, err := schema.ListMessages(ctx, b.db.Pool, b.owner, "demo", "", 10)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "m1", msgs[0].ID)
	require.Equal(t, "demo", msgs[0].ConversationID)
	require.Equal(t, "hello from me", msgs[0].Content, "each owner reads only their own message")

	// Deleted and created again, the id is a new conversation with a new
	// key: nothing keyed by the old one reaches it.
	key, err := schema.DeleteConversation(ctx, b.db.Pool, b.owner, "demo")
	require.NoError(t, err)
	require.Equal(t, mine.Key, key)
	reborn, _, err := schema.CreateConversation(ctx, b.db.Pool, b.owner, "demo", "")
	require.NoError(t, err)
	require.NotEqual(t, mine.Key, reborn.Key)
	_, err = schema.ConversationByKey(ctx, b.db.Pool, b.owner, mine.Key)
	require.ErrorIs(t, err, schema.ErrNotFound)
	_, err = schema.ConversationByKey(ctx, b.db.Pool, b.owner, theirs.Key)
	require.ErrorIs(t, err, schema.ErrNotFound, "another owner's key is not found either")
}

func TestIdsWithSurroundingWhitespaceAreRefused(t *testing.T) {
	t.Parallel()
	for _, id := range []string{" demo", "demo ", "\u00a0demo", "demo\u2003", "\tdemo"} {
		require.Error(t, schema.ValidateID("conversation", id), "%q", id)
	}
	for _, id := range []string{"de mo", "a.b*c> d", "ünï", "x"} {
		require.NoError(t, schema.ValidateID("conversation", id), "%q", id)
	}
}

// TestClaimTakesAtMostMaxRowsOldestFirst: a conversation with more pending
// messages than a turn may carry is answered in turns of at most MaxRows,
// in order, and the claim says when more remain.
func TestClaimTakesAtMostMaxRowsOldestFirst(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	var ids []int64
	for i := range 7 {
		ids = append(ids, b.send(t, "c", fmt.Sprintf("m%d", i), "hi"))
	}
	var turns [][]int64
	for i := 0; ; i++ {
		var c schema.Claim
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			c, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: b.key("c"), RunID: fmt.Sprintf("run-%d", i), Worker: "test", Lease: time.Minute, MaxAttempts: 3, MaxRows: 3})
			return err
		}))
		if c.Empty() {
			break
		}
		turns = append(turns, c.OutboxIDs)
		require.Equal(t, len(turns)*3 < len(ids), c.More, "turn %d says whether rows remain", i)
		_, err := b.finalize(t, c, c.RunID)
		require.NoError(t, err)
	}
	require.Equal(t, [][]int64{ids[0:3], ids[3:6], ids[6:7]}, turns)
}

func TestRetriesOfAConversationAreLimitedPerHour(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	b.send(t, "c", "m1", "hi")
	fail := func(run string) {
		c, err := b.claim(t, "c", run, time.Minute)
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := schema.FailAttemptTx(ctx, tx, schema.Failure{ConversationID: b.key("c"), RunID: run, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Reason: "down", MaxAttempts: 1})
			return err
		}))
	}
	retry := func() (schema.RetryResult, error) {
		var res schema.RetryResult
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			res, err = schema.RetryFailedTx(ctx, tx, schema.Retry{OwnerID: b.owner, ConversationID: "c", MaxPerHour: 2})
			return err
		})
		return res, err
	}
	// Nothing failed yet: a retry does nothing and does not count.
	res, err := retry()
	require.NoError(t, err)
	require.Empty(t, res.OutboxIDs)
	for i := range 2 {
		fail(fmt.Sprintf("run-%d", i))
		res, err := retry()
		require.NoError(t, err)
		require.Len(t, res.OutboxIDs, 1)
	}
	fail("run-2")
	_, err = retry()
	var q *schema.QuotaError
	require.True(t, errors.As(err, &q), "the third retry within the hour is refused: %v", err)
	require.ErrorIs(t, err, schema.ErrQuota)
	require.Greater(t, q.RetryAfter, 59*time.Minute)
	require.Equal(t, []string{"error"}, b.statuses(t, "c"), "a refused retry changes nothing")

	// An hour later the window starts again.
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET retry_window_started_at = now() - interval '61 minutes'`)
	require.NoError(t, err)
	res, err = retry()
	require.NoError(t, err)
	require.Len(t, res.OutboxIDs, 1)
}

func TestConversationQuotaPerOwner(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	create := func(owner int64, id string) error {
		return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if err := schema.CheckConversationQuotaTx(ctx, tx, owner, 2); err != nil {
				return err
			}
			_, _, err := schema.CreateConversation(ctx, tx, owner, id, "")
			return err
		})
	}
	require.NoError(t, create(b.owner, "a"))
	require.NoError(t, create(b.owner, "b"))
	require.ErrorIs(t, create(b.owner, "c"), schema.ErrQuota)
	_, other, err := schema.CreateToken(ctx, b.db.Pool, "other")
	require.NoError(t, err)
	require.NoError(t, create(other.ID, "c"), "another owner's quota is their own")
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM conversations WHERE owner_id = $1`, b.owner).Scan(&n))
	require.Equal(t, 2, n)
}
