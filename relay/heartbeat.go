package relay

import (
	"context"
	"errors"
	"time"

	"github.com/batonhq/baton/schema"
)

// heartbeatLoop writes a non-transactional logical message into the WAL
// while this relay streams. pgoutput skips transactions of tables outside
// the publication, so on a database whose outbox is idle and whose other
// tables are busy the relay would otherwise never receive a position to
// confirm, and the slot would pin WAL without bound. The relay confirms a
// heartbeat's position once everything before it is acknowledged.
//
// Each tick also records the slot's progress and refreshes its metrics.
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

// observeSlot records the slot's progress (schema.RecordSlotProgress), so
// that `baton status` can tell how long its confirmed position has stood
// still, and refreshes the slot's metrics. Every relay does it, the ones
// standing by too: when the streaming relay hangs, their records and
// metrics show the stall.
func (r *Relay) observeSlot(ctx context.Context) error {
	p, err := schema.RecordSlotProgress(ctx, r.pool, r.cfg.Slot)
	if errors.Is(err, schema.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case p.Unwritable && !r.progressUnrecorded:
		r.progressUnrecorded = true
		r.log.Warn().Str("slot", r.cfg.Slot).Msg("the slot's progress cannot be recorded in relay_slot_progress (the table is missing, or this database role may not write it): baton status cannot tell a stalled slot; run `baton migrate`, which creates the table and grants baton_relay what it needs")
	case !p.Unwritable && r.progressUnrecorded:
		r.progressUnrecorded = false
		r.log.Info().Str("slot", r.cfg.Slot).Msg("the slot's progress is recorded again")
	}
	r.metrics.slotLag.Set(float64(p.LagBytes))
	r.metrics.retainedWAL.Set(float64(p.RetainedBytes))
	r.metrics.slotStalled.Set(p.Stalled.Seconds())
	return nil
}
