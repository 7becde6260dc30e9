package relay

import (
	"context"
	"time"

	"github.com/batonhq/baton/schema"
	"github.com/jackc/pgx/v5"
)

// sweepLoop announces again, every SweepInterval, the pending rows that no
// worker claimed within SweepAge of their insert or last announcement.
// JetStream is a wake-up, not the truth: with lazy fsync it can lose
// acknowledged events, and a wiped stream loses all of them. Postgres still
// holds every pending row, so the sweeper loses no turn.
func (r *Relay) sweepLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		n, err := r.sweep(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.log.Warn().Err(err).Msg("sweep failed; retrying on the next tick")
		case n > 0:
			r.log.Info().Int("rows", n).Msg("swept: pending rows announced again")
		}
	}
}

// sweep runs one sweep and returns the number of rows it announced. Each
// batch marks its rows announced_at = now() in the transaction that
// announces them, so a row is announced at most once per SweepAge (which is
// at least SweepInterval), and SKIP LOCKED lets several relays sweep side by
// side. The partial index agent_outbox_sweep keeps it to the pending rows.
func (r *Relay) sweep(ctx context.Context) (int, error) {
	total := 0
	defer func() {
		r.metrics.sweeps.Inc()
		r.metrics.rowsSwept.Add(float64(total))
	}()
	for {
		ids, err := r.announceTx(ctx, func(tx pgx.Tx) ([]int64, error) {
			return schema.AnnounceStaleTx(ctx, tx, r.cfg.SweepAge, r.cfg.SweepBatch)
		})
		total += len(ids)
		if err != nil || len(ids) < r.cfg.SweepBatch {
			return total, err
		}
	}
}
