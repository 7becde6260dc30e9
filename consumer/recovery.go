package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// recoveryBatch is how many expired runs one transaction recovers.
const recoveryBatch = 100

// recoveryLoop recovers expired leases every RecoveryInterval until ctx
// ends. A worker that receives a trigger for such a conversation recovers
// it inline too; this loop covers conversations nobody sends a trigger for.
func (w *Worker) recoveryLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.RecoveryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.recoverExpired(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			w.log.Error().Err(err).Msg("recover expired leases")
		}
	}
}

// recoverExpired recovers every run whose lease has expired, in batches,
// each in one transaction with the announcement of its retried rows.
func (w *Worker) recoverExpired(ctx context.Context) error {
	return w.recoverBatches(ctx, schema.RecoverExpiredTx)
}

// recoverBatches recovers the runs that find picks, recoveryBatch at a
// time, each batch in one transaction with the announcement of its retried
// rows, until a batch comes back short.
func (w *Worker) recoverBatches(ctx context.Context, find func(context.Context, schema.Executor, int, int) ([]schema.Recovery, error)) error {
	for {
		var recs []schema.Recovery
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			var err error
			recs, err = find(ctx, tx, recoveryBatch, w.cfg.MaxAttempts)
			if err != nil {
				return err
			}
			var retry []int64
			for _, r := range recs {
				retry = append(retry, r.RetryIDs...)
			}
			return schema.AnnounceTx(ctx, tx, batonnats.ReasonRetry, retry)
		})
		if err != nil {
			return err
		}
		for _, r := range recs {
			w.recovered(r)
		}
		if len(recs) < recoveryBatch {
			return nil
		}
	}
}

// recovered reports a committed recovery.
func (w *Worker) recovered(r schema.Recovery) {
	if r.Outcome == schema.RecoveryNone {
		return
	}
	w.metrics.recoveries.WithLabelValues(r.Outcome).Inc()
	w.log.Info().Str("conversation_id", r.ConversationID).Str("run_id", r.RunID).Str("turn_id", r.TurnID).
		Str("outcome", r.Outcome).Msg("recovered run")
	s := batonnats.ConversationEvent{ConversationID: r.ConversationID, RunID: r.RunID, TurnID: r.TurnID, Type: batonnats.EventPending, OutboxIDs: r.RetryIDs}
	switch r.Outcome {
	case schema.RecoveryFailed:
		s.Type, s.OutboxIDs, s.MessageID = batonnats.EventFailed, r.FailedIDs, r.ErrorMessageID
	case schema.RecoveryStopped:
		s.Type, s.OutboxIDs, s.MessageID = batonnats.EventStopped, r.StoppedIDs, r.ReplyID
		if len(r.RetryIDs) > 0 {
			// Interrupted by a newer message: its rows wait again, to be
			// answered with it.
			w.emit(s)
			s.Type, s.OutboxIDs, s.MessageID = batonnats.EventPending, r.RetryIDs, ""
		}
	}
	w.emit(s)
}
