package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestTableStatsShowsEachGrowingTableItsSizeAndItsOldestRow(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	stats, err := schema.TableStats(ctx, db.Pool)
	require.NoError(t, err)
	var tables []string
	for _, s := range stats {
		tables = append(tables, s.Table)
		require.Positive(t, s.Bytes, "%s has a size on disk (its indexes at least)", s.Table)
		require.Nil(t, s.Oldest, "%s is empty", s.Table)
	}
	require.Equal(t, []string{"agent_outbox", "agent_runs", "operations", "group_inbox", "group_dead_letters", "audit_events", "operator_actions", "messages"}, tables)

	applied := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO group_inbox (group_name, event_id, stream, stream_seq, processed_at) VALUES
			('audit', 'outbox-1', 'BATON_OUTBOX', 1, $1), ('audit', 'outbox-2', 'BATON_OUTBOX', 2, $1::timestamptz + interval '1 minute')`, applied)
	require.NoError(t, err)
	stats, err = schema.TableStats(ctx, db.Pool)
	require.NoError(t, err)
	for _, s := range stats {
		if s.Table == schema.TableInbox {
			require.NotNil(t, s.Oldest)
			require.True(t, s.Oldest.Equal(applied), "the oldest inbox row was applied at %s, not %s", applied, s.Oldest)
			require.Equal(t, "inbox row, applied", s.Of)
		}
	}
}

func TestRetentionNamesTheSettingThatCannotWork(t *testing.T) {
	t.Parallel()
	require.NoError(t, schema.Retention{}.WithDefaults().Validate())
	for field, r := range map[string]schema.Retention{
		"Outbox":          {Outbox: -time.Second},
		"Runs":            {Runs: -time.Second},
		"Operations":      {Operations: -time.Second},
		"Batch":           {Batch: -1},
		"PassTime":        {PassTime: -time.Second},
		"OperatorActions": {OperatorActions: -time.Second},
	} {
		err := r.WithDefaults().Validate()
		require.ErrorContains(t, err, field, "a bad %s is named", field)
	}
}

// TestPruneDeletesOperatorActionsPastTheirRetentionOnly: the console's
// record of operators' actions goes once older than its retention; the
// newer ones stay, and a dry run counts the same.
func TestPruneDeletesOperatorActionsPastTheirRetentionOnly(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO operator_actions (at, operator, role, action, target) VALUES
			(now() - interval '100 days', 'ops', 'admin', 'retry_turn', 'c1'),
			(now() - interval '91 days', 'ops', 'admin', 'view_conversation', 'c1'),
			(now() - interval '1 day', 'ops', 'viewer', 'view_conversation', 'c2')`)
	require.NoError(t, err)
	dry, err := schema.PruneDryRun(ctx, db.Pool, schema.Retention{}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), dry.Rows[schema.TableOperatorActions])
	res, err := schema.Prune(ctx, db.Pool, schema.Retention{}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Rows[schema.TableOperatorActions], "the default retention is 90 days")
	left, err := schema.OperatorActions(ctx, db.Pool, 0, 10)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, "c2", left[0].Target)
}

// TestPruneKeepsTheOperationsOfATurnThatWaitsToGoOnFromItsJournal: the
// operation of an ended run attached to no message goes with the
// retention, unless its turn's rows wait to go on from the journal: the
// operation's outcome is what keeps the turn from sending its call again.
func TestPruneKeepsTheOperationsOfATurnThatWaitsToGoOnFromItsJournal(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	b.conversation(t, "c")
	id := b.send(t, "c", "m1", "open a ticket")
	old := time.Now().Add(-time.Hour)
	for _, run := range []string{"run_orphan", "run_journaled"} {
		_, err := b.db.Pool.Exec(ctx, `
			INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, status, started_at, lease_expires_at, finished_at)
			VALUES ($1, $2, $1, '{}', 'w', 'recovered', $3, $3, $3)`, run, b.key("c"), old)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, `
			INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, effect, status, turn_id, epoch, step)
			VALUES ($1, $2, 'call_1', 'ticket', 'write', 'completed', $1, 0, 0)`, run, b.key("c"))
		require.NoError(t, err)
	}
	// The pending row belongs to the journaled turn.
	_, err := b.db.Pool.Exec(ctx, `UPDATE agent_outbox SET steps_turn_id = 'run_journaled' WHERE id = $1`, id)
	require.NoError(t, err)

	res, err := schema.Prune(ctx, b.db.Pool, schema.Retention{Outbox: time.Minute, Runs: time.Minute, Operations: time.Minute}.WithDefaults(), nil, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Rows[schema.TableOperations], "the orphan goes")
	require.Equal(t, 1, testenv.Count(t, b.db.Pool, `SELECT count(*) FROM operations WHERE run_id = 'run_journaled'`),
		"the operation of the turn that waits to go on from its journal stays")
}
