package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton/schema"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgreSQL error codes the relay acts on.
const (
	pgDuplicateObject       = "42710"
	pgObjectInUse           = "55006"
	pgUndefinedObject       = "42704"
	pgInsufficientPrivilege = "42501"
)

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// ensurePublication checks that the publication of agent_outbox inserts
// exists. It must exist before the slot: pgoutput looks publications up as
// of each decoded transaction. `baton migrate` creates the default one
// (the schema's owner owns it), so a relay that runs with only the rights
// it needs finds it there. One that is missing is created when the relay's
// user may (development, one superuser for everything); otherwise the
// error says what to run.
func (r *Relay) ensurePublication(ctx context.Context) error {
	var exists bool
	if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, r.cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("look up publication %s: %w", r.cfg.Publication, err)
	}
	if exists {
		return nil
	}
	create := `CREATE PUBLICATION ` + pgx.Identifier{r.cfg.Publication}.Sanitize() + ` FOR TABLE agent_outbox WITH (publish = 'insert')`
	_, err := r.pool.Exec(ctx, create)
	switch {
	case pgCode(err) == pgDuplicateObject:
		return nil // another relay was faster
	case pgCode(err) == pgInsufficientPrivilege:
		return &fatalError{fmt.Errorf("publication %s does not exist and the relay's database user may not create it: run `baton migrate` as the schema's owner (it creates %s), or as the owner of agent_outbox: %s", r.cfg.Publication, DefaultPublication, create)}
	case err != nil:
		return fmt.Errorf("create publication %s: %w", r.cfg.Publication, err)
	}
	r.log.Info().Str("publication", r.cfg.Publication).Msg("publication created")
	return nil
}

// slotState is the slot as pg_replication_slots shows it.
type slotState struct {
	exists    bool
	plugin    string
	database  string
	walStatus string
	confirmed pglogrepl.LSN
}

func (r *Relay) inspectSlot(ctx context.Context) (slotState, error) {
	var s slotState
	var plugin, database, walStatus *string
	var confirmed *string
	err := r.pool.QueryRow(ctx, `
		SELECT plugin, database, wal_status, confirmed_flush_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&plugin, &database, &walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("look up slot %s: %w", r.cfg.Slot, err)
	}
	s.exists = true
	s.plugin, s.database, s.walStatus = deref(plugin), deref(database), deref(walStatus)
	if confirmed != nil {
		if s.confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return s, err
		}
	}
	return s, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ensureSlot makes sure the slot exists and can be read. A missing slot, or
// one PostgreSQL invalidated because it held too much WAL, is (re)created,
// and every pending row is announced again: the inserts it would have
// carried are gone from its view.
func (r *Relay) ensureSlot(ctx context.Context) error {
	s, err := r.inspectSlot(ctx)
	if err != nil {
		return err
	}
	var db string
	if err := r.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return err
	}
	reason := ""
	switch {
	case !s.exists:
		reason = "missing"
	case s.database != db:
		return &fatalError{fmt.Errorf("slot %s belongs to database %q, not %q: choose another --slot / BATON_SLOT (slot names are global to the server)", r.cfg.Slot, s.database, db)}
	case s.plugin != "pgoutput":
		return &fatalError{fmt.Errorf("slot %s uses plugin %q, not pgoutput: choose another --slot / BATON_SLOT, or drop that slot", r.cfg.Slot, s.plugin)}
	case s.walStatus == "lost":
		reason = "lost"
		// An invalidated slot can never stream again; dropping it is the
		// only way to reuse its name.
		if _, err := r.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, r.cfg.Slot); err != nil && pgCode(err) != pgUndefinedObject {
			return fmt.Errorf("drop invalidated slot %s: %w", r.cfg.Slot, err)
		}
	default:
		return nil
	}
	// Whether relays recorded the slot before is read before it exists
	// again: once it does, this relay's own heartbeat records it.
	recordedBefore := r.slotRecorded(ctx)
	// The publication must exist when the slot starts, or decoding fails
	// on the first transaction.
	_, err = r.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, r.cfg.Slot)
	if pgCode(err) == pgDuplicateObject {
		return nil // another relay created it, and announces
	}
	if err != nil {
		return fmt.Errorf("create slot %s (the relay's database user needs the REPLICATION attribute, and max_replication_slots room): %w", r.cfg.Slot, err)
	}
	// Every row committed before the slot's start is visible now; every
	// later one reaches the slot. Announcing the pending ones through the
	// slot closes the gap without a second path to JetStream.
	n, err := r.announcePending(ctx)
	if err != nil {
		return fmt.Errorf("slot %s created, announcing pending rows: %w", r.cfg.Slot, err)
	}
	// A first start creates the slot: nothing was lost. A lost slot, or
	// one missing though relays recorded it before (dropped, or a
	// promoted standby, which has no logical slots), means events may
	// have been missed: the announcement covers them, and it is worth a
	// warning.
	if reason == "missing" && !recordedBefore {
		r.log.Info().Str("slot", r.cfg.Slot).Int("rows_announced", n).Msg("slot created")
		return nil
	}
	r.log.Warn().Str("slot", r.cfg.Slot).Str("cause", reason).Int("rows_announced", n).
		Msg("slot (re)created; pending rows announced again")
	return nil
}

// slotRecorded reports whether a relay recorded the slot's progress
// before (relay_slot_progress, migration 00006); false when that cannot be
// read.
func (r *Relay) slotRecorded(ctx context.Context) bool {
	var recorded bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM relay_slot_progress WHERE slot_name = $1)`, r.cfg.Slot).Scan(&recorded)
	return err == nil && recorded
}

// announcePending announces every pending outbox row again, in batches of
// SweepBatch, and marks them announced so the sweeper does not repeat them.
func (r *Relay) announcePending(ctx context.Context) (int, error) {
	total := 0
	var after int64
	for {
		ids, err := r.announceTx(ctx, func(tx pgx.Tx) ([]int64, error) {
			return schema.AnnouncePendingTx(ctx, tx, after, r.cfg.SweepBatch)
		})
		if err != nil {
			return total, err
		}
		total += len(ids)
		if len(ids) < r.cfg.SweepBatch {
			return total, nil
		}
		for _, id := range ids {
			after = max(after, id)
		}
	}
}

// announceTx runs mark, which marks rows announced and announces them,
// in one transaction: the announcement exists exactly when the mark does.
func (r *Relay) announceTx(ctx context.Context, mark func(pgx.Tx) ([]int64, error)) ([]int64, error) {
	var ids []int64
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = mark(tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}
