package relay

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton/schema"
	"github.com/jackc/pgx/v5"
)

// heartbeatLoop writes a non-transactional logical message into the WAL
// while this relay streams. pgoutput skips transactions of tables outside
// the publication, so on a database whose outbox is idle and whose other
// tables are busy the relay would otherwise never receive a position to
// confirm, and the slot would pin WAL without bound. The relay confirms a
// heartbeat's position once everything before it is acknowledged.
//
// Each tick also refreshes the slot's lag and retained WAL metrics.
func (r *Relay) heartbeatLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.HeartbeatInterval)
	defer ticker.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		err := r.observeSlot(ctx)
		if err == nil && r.active.Load() {
			err = r.heartbeat(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			r.log.Warn().Err(err).Msg("heartbeat failed; retrying on the next tick")
			failing = true
		case err == nil && failing:
			r.log.Info().Msg("heartbeat resumed")
			failing = false
		}
	}
}

// heartbeat emits one heartbeat message.
func (r *Relay) heartbeat(ctx context.Context) error {
	return schema.EmitHeartbeat(ctx, r.pool, time.Now())
}

// observeSlot refreshes the slot lag and retained WAL metrics.
func (r *Relay) observeSlot(ctx context.Context) error {
	var lag, retained *int64
	err := r.pool.QueryRow(ctx, `
		SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint,
		       (pg_current_wal_lsn() - restart_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&lag, &retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if lag != nil {
		r.metrics.slotLag.Set(float64(*lag))
	}
	if retained != nil {
		r.metrics.retainedWAL.Set(float64(*retained))
	}
	return nil
}
