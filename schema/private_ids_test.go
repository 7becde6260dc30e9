package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestTheIdsOfANewTurnSayNothingOfTheServersMessageCount: a turn's id and
// its reply's id were unsalted hashes of the global outbox ids, which
// anyone could invert by counting. A turn over rows inserted now hashes
// them with its conversation's secret salt: neither id is the unsalted
// one, the same row numbers give other ids in another conversation, and
// finalize writes the reply under the id the claim announced.
func TestTheIdsOfANewTurnSayNothingOfTheServersMessageCount(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	b.conversation(t, "c")
	row := b.send(t, "c", "m1", "one")
	c, err := b.claim(t, "c", "run-1", time.Minute)
	require.NoError(t, err)
	require.NotEqual(t, schema.TurnID([]int64{row}), c.TurnID, "the turn id is not the unsalted hash of the row")
	require.NotEqual(t, schema.ReplyID([]int64{row}, 0), c.ReplyID(), "nor is the reply id")
	turnID, replyID, err := schema.TurnIDs(context.Background(), b.db.Pool, b.key("c"), []int64{row}, 0)
	require.NoError(t, err)
	require.Equal(t, turnID, c.TurnID)
	require.Equal(t, replyID, c.ReplyID())
	out, err := b.finalize(t, c, "run-1")
	require.NoError(t, err)
	require.Equal(t, c.ReplyID(), out.MessageID, "the reply is written under the id the claim announced")

	// The same row numbers in another conversation: other ids.
	b.conversation(t, "d")
	otherTurn, otherReply, err := schema.TurnIDs(context.Background(), b.db.Pool, b.key("d"), []int64{row}, 0)
	require.NoError(t, err)
	require.NotEqual(t, c.TurnID, otherTurn)
	require.NotEqual(t, c.ReplyID(), otherReply)
}

// TestATurnWhoseRowsPredateTheSaltKeepsItsIdsAcrossReclaims: rows stored
// before migration 00026 (salted_ids NULL) keep the unsalted ids, so that
// a turn claimed before the change, claimed again after a worker died,
// still announces and finalizes the reply id its streams were told, and
// writes one reply. A turn whose steps were journaled keeps the turn id
// of its journal, whatever derived it (a worker of an older version).
func TestATurnWhoseRowsPredateTheSaltKeepsItsIdsAcrossReclaims(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "old")
	row := b.send(t, "old", "m1", "one")
	_, err := b.db.Pool.Exec(ctx, `UPDATE agent_outbox SET salted_ids = NULL WHERE id = $1`, row)
	require.NoError(t, err)

	first, err := b.claim(t, "old", "run-1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, schema.TurnID([]int64{row}), first.TurnID, "the id the turn had before the salt")
	require.Equal(t, schema.ReplyID([]int64{row}, 0), first.ReplyID())
	// The worker dies; its lease runs out, and another claims the turn.
	_, err = b.db.Pool.Exec(ctx, `UPDATE conversations SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, b.key("old"))
	require.NoError(t, err)
	again, err := b.claim(t, "old", "run-2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, first.OutboxIDs, again.OutboxIDs)
	require.Equal(t, first.TurnID, again.TurnID)
	require.Equal(t, first.ReplyID(), again.ReplyID(), "the reply keeps the id its streams were told")
	out, err := b.finalize(t, again, "run-2")
	require.NoError(t, err)
	require.Equal(t, first.ReplyID(), out.MessageID)
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, b.key("old")))

	// A journaled turn keeps its journal's turn id.
	b.conversation(t, "journaled")
	row = b.send(t, "journaled", "m2", "two")
	_, err = b.db.Pool.Exec(ctx, `UPDATE agent_outbox SET steps_turn_id = $2 WHERE id = $1`, row, schema.TurnID([]int64{row}))
	require.NoError(t, err)
	c, err := b.claim(t, "journaled", "run-3", time.Minute)
	require.NoError(t, err)
	require.Equal(t, schema.TurnID([]int64{row}), c.TurnID, "the turn goes on from its journal under the id it was journaled with")
	require.True(t, c.Journaled)
}
