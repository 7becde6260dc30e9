package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// The ends of a turn. Each commits one transaction fenced by the run's
// lease, then settles the triggers: acked once a commit covers them,
// returned to the group when none did.

// settleLost ends a turn whose conversation is gone, or whose run lost the
// conversation to another, or that was asked to stop, when err says so:
// the errors every end of a turn can meet. It reports whether err was one
// of them.
func (t *turn) settleLost(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, schema.ErrStopRequested):
		// Asked to stop before this end committed: the turn ends stopped,
		// with what it showed.
		t.finalize(ctx, t.live.stopped(), true)
	case errors.Is(err, schema.ErrConversationDeleted):
		t.cancelled(ctx)
	case errors.Is(err, schema.ErrLeaseLost):
		t.abandoned(ctx, err)
	default:
		return false
	}
	return true
}

// retryLater returns the triggers of a turn whose end could not commit:
// the lease still holds the rows, recovery resolves them once it expires,
// and the triggers come back before that.
func (t *turn) retryLater(what string, err error) {
	t.log.Error().Err(err).Msg(what)
	nakAll(t.batch, t.w.cfg.RetryDelay)
}

// finalize commits the reply (stopped: what a stopped turn showed), then
// acks.
func (t *turn) finalize(ctx context.Context, reply Reply, stopped bool) {
	w, c := t.w, t.claim
	if _, ok := w.awaitSession(ctx, commitTimeout); !ok {
		// A worker that lost its session finalizes nothing until it holds
		// it again: another may be taking its runs over meanwhile.
		t.log.Error().Msg("finalize: the worker session was not held again within the commit deadline")
		w.metrics.turnsFinished.WithLabelValues("error").Inc()
		nakAll(t.batch, w.cfg.RetryDelay)
		return
	}
	fctx, span := telemetry.Tracer().Start(ctx, "finalize")
	out, err := commitFinalize(fctx, w, schema.Finalize{
		ConversationID: c.ConversationID,
		RunID:          c.RunID,
		TurnID:         c.TurnID,
		OutboxIDs:      c.OutboxIDs,
		Generation:     c.Generation,
		Content:        reply.Content,
		Reasoning:      reply.Reasoning,
		Truncated:      reply.Truncated,
		Stopped:        stopped,
		// A capped turn leaves pending rows for the next one on purpose:
		// they never supersede it; nor do they under any double texting
		// but debounce.
		SupersedeIfNewer: w.cfg.Debounce > 0 && !c.More && !stopped && c.DoubleTexting == schema.DoubleTextingDebounce,
	})
	span.End()
	switch {
	case err == nil && out.Superseded:
		t.superseded()
		return
	case err == nil && out.Interrupted:
		t.interrupted(out.MessageID)
		return
	case t.settleLost(ctx, err):
		return
	case err != nil:
		w.metrics.turnsFinished.WithLabelValues("error").Inc()
		t.retryLater("finalize", err)
		return
	}
	w.crash.at(CrashAfterFinalizeBeforeAck)
	ackAll(t.batch)
	outcome, event := "replied", batonnats.EventReplied
	if out.Stopped {
		outcome, event = "stopped", batonnats.EventStopped
	}
	w.metrics.turnsFinished.WithLabelValues(outcome).Inc()
	w.metrics.insertToFinal.Observe(time.Since(c.FirstCreatedAt).Seconds())
	w.emit(t.event(event, out.MessageID))
	t.log.Debug().Str("message_id", out.MessageID).Int64("operations", out.Operations).Str("outcome", outcome).Msg("turn finalized")
}

// commitFinalize ends a turn in one transaction. It is a variable only so
// that the chaos harness can prove it fails a finalize that is not atomic:
// a build with the chaosbroken tag replaces it, and no other code does.
var commitFinalize = func(ctx context.Context, w *Worker, f schema.Finalize) (schema.Finalized, error) {
	r := w.finalizes.do(f)
	if errors.Is(r.Err, schema.ErrRunAlone) {
		// The batch waits for no conversation: this one waits on its own,
		// within this turn's commit deadline. It does not take one of the
		// places of claims that wait (w.alone): most lone finalizes are
		// turns a newer message superseded, which wait for nothing, and
		// must not queue behind one that waits for a held conversation.
		w.metrics.alone.WithLabelValues("finalize").Inc()
		return schema.FinalizeTurn(ctx, w.pool, f)
	}
	return r.Finalized, r.Err
}

// park stops a turn at the call that waits for approval: the call, the
// turn's state and the approval commit with the rows back to pending and
// the conversation released, in one transaction fenced by the run's lease.
// The triggers are acked: the decision announces the rows again.
//
// A turn that was asked to stop meanwhile does not wait: it ends stopped
// with what it showed, and the call is never journaled.
func (t *turn) park(ctx context.Context, s *Suspended) {
	w, c := t.w, t.claim
	p := t.journal.parkRequest()
	if q := s.Question; q != nil {
		p = &schema.ApprovalRequest{ConversationID: c.ConversationID, RunID: c.RunID, Epoch: c.Epoch, Step: s.Step,
			Question: &schema.Question{ID: q.ID, Reason: q.Reason, Message: q.Message, ToolCallID: q.ToolCallID, Tool: q.Tool,
				Arguments: q.Arguments, ResponseSchema: q.ResponseSchema, Data: q.Data}}
	}
	if p == nil {
		t.fail(ctx, errors.New("the turn stopped for an approval that the journal did not ask for"))
		return
	}
	p.TurnID, p.OutboxIDs, p.State, p.TTL = c.TurnID, c.OutboxIDs, s.State, w.cfg.ApprovalTTL
	var out schema.Requested
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.RequestApprovalTx(ctx, tx, *p)
		return err
	})
	switch {
	case t.settleLost(ctx, err):
		return
	case err != nil:
		// Nothing was sent: the attempt fails like any other.
		t.fail(ctx, fmt.Errorf("record the approval request: %w", err))
		return
	}
	ackAll(t.batch)
	w.metrics.turnsFinished.WithLabelValues("waiting_for_approval").Inc()
	ev := t.event(batonnats.EventWaitingForApproval, "")
	ev.ApprovalID, ev.Tool, ev.ExpiresAt = out.ApprovalID, p.Operation.Tool, &out.ExpiresAt
	if p.Question != nil {
		ev.Tool = p.Question.Tool
	}
	w.emit(ev)
	t.log.Info().Str("approval_id", out.ApprovalID).Str("tool", p.Operation.Tool).Time("expires_at", out.ExpiresAt).
		Msg("turn waits for the approval of a call")
}

// supersede hands a turn back after its model call was cancelled for a
// newer message; a turn that was asked to stop meanwhile ends stopped
// instead, with what it showed.
func (t *turn) supersede(ctx context.Context) {
	c := t.claim
	var done bool
	err := pgx.BeginFunc(ctx, t.w.pool, func(tx pgx.Tx) error {
		var err error
		done, err = schema.SupersedeTx(ctx, tx, c.ConversationID, c.RunID, c.OutboxIDs, false)
		return err
	})
	switch {
	case t.settleLost(ctx, err):
	case err != nil:
		t.retryLater("supersede", err)
	case !done:
		// A write started after all (recorded before the journal closed):
		// the turn can no longer be repeated; recovery rules once the
		// lease expires, and the attempt fails visibly.
		t.fail(ctx, errSuperseded)
	default:
		t.superseded()
	}
}

// superseded puts a handed-back turn's triggers back into its mailbox,
// which claims again at once: the next turn takes the handed-back rows
// with the newer ones.
func (t *turn) superseded() {
	w := t.w
	w.mu.Lock()
	t.mb.waiting = append(t.batch, t.mb.waiting...)
	t.mb.more = true
	w.mu.Unlock()
	w.metrics.turnsFinished.WithLabelValues("superseded").Inc()
	w.emit(t.event(batonnats.EventPending, ""))
	t.log.Debug().Msg("turn superseded by newer messages; claiming again")
}

// interrupted puts the triggers of a turn that a newer message
// interrupted (DoubleTextingInterrupt) back into its mailbox, which claims
// again at once: the turn's stopped reply is committed, and its rows wait
// again, for the next turn to answer them with the newer message.
func (t *turn) interrupted(replyID string) {
	w := t.w
	w.mu.Lock()
	t.mb.waiting = append(t.batch, t.mb.waiting...)
	t.mb.more = true
	w.mu.Unlock()
	w.metrics.turnsFinished.WithLabelValues("interrupted").Inc()
	w.emit(t.event(batonnats.EventStopped, replyID))
	w.emit(t.event(batonnats.EventPending, ""))
	t.log.Debug().Str("message_id", replyID).Msg("turn interrupted by a newer message; its messages are answered again with it")
}

// cancelled ends a turn whose conversation was deleted: its result is
// discarded and nothing is recreated; the triggers are done with.
func (t *turn) cancelled(ctx context.Context) {
	// The run's row went with the conversation; this records nothing
	// unless it survived.
	_ = schema.MarkRun(ctx, t.w.pool, t.claim.RunID, "cancelled", "conversation deleted during the turn")
	ackAll(t.batch)
	t.w.metrics.turnsFinished.WithLabelValues("cancelled").Inc()
	t.w.emit(t.event(batonnats.EventCancelled, ""))
	t.log.Info().Msg("conversation deleted during the turn; result discarded")
}

// abandoned ends a turn that lost its lease: whoever took the conversation
// over owns the rows now. The triggers go back, since a trigger only means
// "look at this conversation".
func (t *turn) abandoned(ctx context.Context, cause error) {
	if err := schema.MarkRun(ctx, t.w.pool, t.claim.RunID, "abandoned", cause.Error()); err != nil {
		t.log.Warn().Err(err).Msg("record abandoned run")
	}
	nakAll(t.batch, t.w.cfg.BusyDelay)
	t.w.metrics.turnsFinished.WithLabelValues("abandoned").Inc()
	t.log.Warn().Err(cause).Msg("turn abandoned")
}

// fail records a failed attempt: back to pending and announced again
// under the cap, a visible error at it, in one transaction.
func (t *turn) fail(ctx context.Context, cause error) {
	w, c := t.w, t.claim
	w.metrics.failures.WithLabelValues(failureReason(cause)).Inc()
	var out schema.FailOutcome
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.FailAttemptTx(ctx, tx, schema.Failure{
			ConversationID: c.ConversationID,
			RunID:          c.RunID,
			TurnID:         c.TurnID,
			OutboxIDs:      c.OutboxIDs,
			Reason:         cause.Error(),
			UserText:       userText(cause),
			MaxAttempts:    w.cfg.MaxAttempts,
			Terminal:       IsTerminal(cause),
			NotBefore:      retryAfter(cause),
		})
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonRetry, out.RetryIDs)
	})
	switch {
	case t.settleLost(ctx, err):
		return
	case err != nil:
		t.log.Error().Err(err).AnErr("attempt_error", cause).Msg("record failed attempt")
		nakAll(t.batch, w.cfg.RetryDelay)
		return
	}
	// The announcement committed with the rows: the triggers in hand are
	// done with either way.
	ackAll(t.batch)
	if out.GaveUp {
		w.metrics.turnsFinished.WithLabelValues("failed").Inc()
		w.emit(t.event(batonnats.EventFailed, out.ErrorMessageID))
		t.log.Warn().Err(cause).Int("attempts", out.Attempts).Msg("turn failed; error shown in the conversation")
		return
	}
	w.metrics.turnsFinished.WithLabelValues("retried").Inc()
	ev := t.event(batonnats.EventPending, "")
	if !out.NotBefore.IsZero() {
		ev.Type, ev.NotBefore = batonnats.EventWaiting, &out.NotBefore
		t.log.Info().Err(cause).Int("attempts", out.Attempts).Time("not_before", out.NotBefore).Msg("the model server asked to wait; the next attempt waits for it")
	} else {
		t.log.Info().Err(cause).Int("attempts", out.Attempts).Msg("attempt failed; turn announced again")
	}
	w.emit(ev)
}

// giveUp ends a turn cut short by shutdown with the recovery rule, at once
// rather than after the lease: back to pending and announced, or failed
// visibly after a started write.
func (t *turn) giveUp(ctx context.Context) {
	w, c := t.w, t.claim
	var r schema.Recovery
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		r, err = schema.RecoverRunTx(ctx, tx, c.ConversationID, c.RunID, w.cfg.MaxAttempts, schema.RecoveryReasonShutdown)
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonRetry, r.RetryIDs)
	})
	if err != nil {
		// The lease expires and another worker recovers the run.
		t.log.Error().Err(err).Msg("give up turn at shutdown")
	} else {
		w.recovered(r)
	}
	nakAll(t.batch, 0)
	w.metrics.turnsFinished.WithLabelValues("abandoned").Inc()
	t.log.Info().Str("outcome", r.Outcome).Msg("turn given up at shutdown")
}

// event is a conversation event of this turn.
func (t *turn) event(typ batonnats.EventType, messageID string) batonnats.ConversationEvent {
	c := t.claim
	return batonnats.ConversationEvent{ConversationID: c.ConversationID, RunID: c.RunID, TurnID: c.TurnID, Type: typ, OutboxIDs: c.OutboxIDs, MessageID: messageID}
}

func ackAll(batch []jetstream.Msg) {
	for _, m := range batch {
		_ = m.Ack()
	}
}

func nakAll(batch []jetstream.Msg, delay time.Duration) {
	for _, m := range batch {
		if delay > 0 {
			_ = m.NakWithDelay(delay)
		} else {
			_ = m.Nak()
		}
	}
}
