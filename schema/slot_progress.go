package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SlotProgress is where a logical replication slot stands, and since when
// its confirmed position has stood still. PostgreSQL keeps the position but
// not when it last moved; relays record that in relay_slot_progress at
// each heartbeat (RecordSlotProgress), so a one-shot reader such as `baton
// status` can tell a stalled slot from a busy one (ReadSlotProgress).
type SlotProgress struct {
	// ConfirmedLSN is the slot's confirmed_flush_lsn, "" while the slot is
	// being created.
	ConfirmedLSN string
	// LagBytes is the WAL written after ConfirmedLSN: what the relay has
	// not confirmed yet.
	LagBytes int64
	// RetainedBytes is the WAL the slot keeps the server from removing.
	RetainedBytes int64
	// Recorded is false when no relay has recorded the slot yet, or the
	// database lacks migration 00006 or the right to write its table: then
	// ProgressedAt is zero and nothing is known of a stall.
	Recorded bool
	// Unwritable is true when RecordSlotProgress could not write the
	// records: the database lacks migration 00006 or the role lacks the
	// right to write relay_slot_progress. (A slot still being created has
	// nothing to record yet, and is not Unwritable.)
	Unwritable bool
	// ProgressedAt is the latest time the confirmed position is known to
	// have moved, or to have had no WAL behind it. When it moved after the
	// last record, the record's time is all that is known, and counts.
	ProgressedAt time.Time
	// ObservedAt is when a relay last recorded the slot: a relay that runs
	// records it at each heartbeat, so an old one means no relay runs.
	ObservedAt time.Time
	// SinceObserved is the time from ObservedAt to now, by the server's
	// clock.
	SinceObserved time.Duration
	// Stalled is how long the confirmed position has stood still, as far as
	// the records tell, while WAL waited behind it; zero while nothing
	// waits or nothing is recorded.
	Stalled time.Duration
}

// RecordSlotProgress looks at a slot and records, in relay_slot_progress,
// its confirmed position and, when the position moved since the last
// record or has no WAL behind it, that it made progress now. Every relay of
// the slot calls it at each heartbeat, streaming or standing by: a relay
// that hangs stops confirming, and the others' records show for how long.
// A database without the table (migration 00006) or the right to write it
// gets the slot's state unrecorded. A slot that does not exist is
// ErrNotFound.
func RecordSlotProgress(ctx context.Context, db Executor, slot string) (SlotProgress, error) {
	p, err := scanSlotProgress(db.QueryRow(ctx, `
		WITH s AS (
			SELECT slot_name, confirmed_flush_lsn AS confirmed,
			       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag,
			       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained
			FROM pg_replication_slots WHERE slot_name = $1),
		p AS (
			INSERT INTO relay_slot_progress AS p (slot_name, confirmed_lsn, progressed_at, observed_at)
			SELECT slot_name, confirmed, now(), now() FROM s WHERE confirmed IS NOT NULL
			ON CONFLICT (slot_name) DO UPDATE SET
				progressed_at = CASE
					WHEN p.confirmed_lsn <> EXCLUDED.confirmed_lsn OR (SELECT lag FROM s) <= 0 THEN now()
					ELSE p.progressed_at END,
				confirmed_lsn = EXCLUDED.confirmed_lsn,
				observed_at = now()
			RETURNING progressed_at, observed_at)
		SELECT s.confirmed::text, coalesce(s.lag, 0), coalesce(s.retained, 0), p.progressed_at, p.observed_at, now()
		FROM s LEFT JOIN p ON true`, slot), slot)
	switch pgErrorCode(err) {
	case pgUndefinedTable, pgInsufficientPrivilege:
		p, err = observeSlot(ctx, db, slot)
		p.Unwritable = err == nil
	}
	return p, err
}

// ReadSlotProgress returns the state of a slot and what relays recorded of
// it, and writes nothing. A slot that does not exist is ErrNotFound.
func ReadSlotProgress(ctx context.Context, db Executor, slot string) (SlotProgress, error) {
	p, err := scanSlotProgress(db.QueryRow(ctx, `
		SELECT s.confirmed_flush_lsn::text,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
		       CASE WHEN p.confirmed_lsn = s.confirmed_flush_lsn THEN p.progressed_at ELSE p.observed_at END,
		       p.observed_at, now()
		FROM pg_replication_slots s LEFT JOIN relay_slot_progress p ON p.slot_name = s.slot_name
		WHERE s.slot_name = $1`, slot), slot)
	switch pgErrorCode(err) {
	case pgUndefinedTable, pgInsufficientPrivilege:
		return observeSlot(ctx, db, slot)
	}
	return p, err
}

// observeSlot is ReadSlotProgress without the records.
func observeSlot(ctx context.Context, db Executor, slot string) (SlotProgress, error) {
	return scanSlotProgress(db.QueryRow(ctx, `
		SELECT confirmed_flush_lsn::text,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
		       NULL::timestamptz, NULL::timestamptz, now()
		FROM pg_replication_slots WHERE slot_name = $1`, slot), slot)
}

func scanSlotProgress(row pgx.Row, slot string) (SlotProgress, error) {
	var p SlotProgress
	var confirmed *string
	var progressed, observed *time.Time
	var now time.Time
	err := row.Scan(&confirmed, &p.LagBytes, &p.RetainedBytes, &progressed, &observed, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("%w: replication slot %q", ErrNotFound, slot)
	}
	if err != nil {
		return p, fmt.Errorf("slot %s progress: %w", slot, err)
	}
	if confirmed != nil {
		p.ConfirmedLSN = *confirmed
	}
	if progressed != nil && observed != nil {
		p.Recorded = true
		p.ProgressedAt = *progressed
		p.ObservedAt = *observed
		p.SinceObserved = max(now.Sub(*observed), 0)
		if p.LagBytes > 0 {
			p.Stalled = max(now.Sub(*progressed), 0)
		}
	}
	return p, nil
}

// PostgreSQL error codes that reading the progress records tolerates.
const (
	pgUndefinedTable        = "42P01"
	pgInsufficientPrivilege = "42501"
)

func pgErrorCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
