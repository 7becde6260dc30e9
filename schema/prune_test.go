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
	require.Equal(t, []string{"agent_outbox", "agent_runs", "operations", "group_inbox", "group_dead_letters", "audit_events", "messages"}, tables)

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
		"Outbox":     {Outbox: -time.Second},
		"Runs":       {Runs: -time.Second},
		"Operations": {Operations: -time.Second},
		"Batch":      {Batch: -1},
		"PassTime":   {PassTime: -time.Second},
	} {
		err := r.WithDefaults().Validate()
		require.ErrorContains(t, err, field, "a bad %s is named", field)
	}
}
