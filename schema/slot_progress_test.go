package schema_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestASlotWithoutAPositionIsNotTakenForUnwritableRecords: a slot that
// has no confirmed position yet (one being created shows so, as does a
// physical slot) has nothing to record, and that is not the missing table
// or right that a relay warns about; only those make Unwritable.
func TestASlotWithoutAPositionIsNotTakenForUnwritableRecords(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	slot := "nopos_" + db.Name
	_, err := db.Pool.Exec(ctx, `SELECT pg_create_physical_replication_slot($1)`, slot)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })

	p, err := schema.RecordSlotProgress(ctx, db.Pool, slot)
	require.NoError(t, err)
	require.Empty(t, p.ConfirmedLSN, "no position yet")
	require.False(t, p.Recorded, "nothing to record")
	require.False(t, p.Unwritable, "the table is there and writable")

	_, err = db.Pool.Exec(ctx, `ALTER TABLE relay_slot_progress RENAME TO relay_slot_progress_away`)
	require.NoError(t, err)
	p, err = schema.RecordSlotProgress(ctx, db.Pool, slot)
	require.NoError(t, err, "the slot's state is still read")
	require.False(t, p.Recorded)
	require.True(t, p.Unwritable, "without the table the records cannot be written")

	_, err = db.Pool.Exec(ctx, `ALTER TABLE relay_slot_progress_away RENAME TO relay_slot_progress`)
	require.NoError(t, err)
	_, err = schema.RecordSlotProgress(ctx, db.Pool, "no_such_slot")
	require.ErrorIs(t, err, schema.ErrNotFound)
}
