package consumer

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// claimRows claims the conversation's pending rows for the turn and loads
// them. It reports false when there is nothing to run: the claim was
// refused or came back empty, and the triggers are settled.
func (t *turn) claimRows() bool {
	w := t.w
	session, ok := w.awaitSession(w.hardCtx, sessionClaimWait)
	if !ok {
		// Claimed now, the run would look like a gone worker's and be
		// taken over at once: its triggers come back once the session
		// may be held again.
		t.log.Debug().Msg("worker session not held; delaying triggers")
		nakAll(t.batch, w.cfg.RetryDelay)
		return false
	}
	_, span := telemetry.Tracer().Start(trace.ContextWithSpan(w.hardCtx, t.span), "claim")
	// One statement claims a free conversation and loads the turn, with
	// the claims of other conversations that are ready at the same time.
	// That statement waits for no conversation: one that another
	// transaction holds, or whose expired run must be recovered first, is
	// claimed here on its own, so that only this turn waits for it, for at
	// most LockWait.
	p := schema.ClaimParams{
		ConversationID: t.mb.conversationID,
		RunID:          t.runID,
		Worker:         w.cfg.Name,
		Lease:          w.cfg.Lease,
		MaxAttempts:    w.cfg.MaxAttempts,
		MaxRows:        w.cfg.MaxTurnMessages,
		Session:        session,
	}
	res := w.claims.do(p)
	if errors.Is(res.Err, schema.ErrRunAlone) {
		res = w.claimAlone(p)
	}
	span.End()
	if res.Err != nil {
		t.refused(res.Err)
		return false
	}
	t.claim, t.input = res.Claim, res.Input
	if r := t.claim.Recovered; r != nil {
		w.recovered(*r)
	}
	if t.claim.Empty() {
		// Redelivered or re-announced triggers whose rows another turn
		// already covered.
		w.metrics.deduplicated.Add(float64(len(t.batch)))
		ackAll(t.batch)
		return false
	}
	t.claimed()
	return true
}

// refused settles the triggers of a claim that took nothing, as its error
// says: later, once the conversation is likely free; never, for a deleted
// conversation or one whose turn waits for an approval.
func (t *turn) refused(err error) {
	w, log, batch := t.w, t.log, t.batch
	var busy *schema.BusyError
	var wait *schema.WaitError
	var approvalWait *schema.ApprovalWaitError
	switch {
	case errors.As(err, &busy):
		// Another run owns the conversation: look again once it is likely
		// done, or its lease has expired and the run can be recovered.
		delay := min(max(time.Until(busy.LeaseExpiresAt)+10*time.Millisecond, 10*time.Millisecond), w.cfg.BusyDelay)
		w.metrics.busy.Add(float64(len(batch)))
		log.Debug().Str("owner_run_id", busy.RunID).Dur("delay", delay).Msg("conversation busy; delaying triggers")
		nakAll(batch, delay)
	case errors.Is(err, schema.ErrConversationDeleted):
		ackAll(batch)
	case errors.Is(err, schema.ErrLockWait):
		// Another transaction holds the conversation: look again later,
		// holding nothing meanwhile.
		w.metrics.busy.Add(float64(len(batch)))
		log.Info().Dur("lock_wait", w.cfg.LockWait).Msg("conversation held by another transaction; delaying triggers")
		nakAll(batch, w.cfg.BusyDelay)
	case errors.Is(err, errAloneFull):
		w.metrics.busy.Add(float64(len(batch)))
		log.Debug().Msg("too many claims wait for held conversations; delaying triggers")
		nakAll(batch, w.cfg.LockWait)
	case errors.As(err, &approvalWait):
		// Nothing can run until someone decides, and the decision
		// announces the rows again (or the sweeper does, once it
		// expired): the triggers are done with.
		w.metrics.waiting.Add(float64(len(batch)))
		log.Debug().Str("approval_id", approvalWait.ApprovalID).Time("expires_at", approvalWait.ExpiresAt).Msg("conversation waits for an approval; triggers done with")
		ackAll(batch)
	case errors.As(err, &wait):
		// The model server asked to wait: the triggers come back when the
		// wait is over, and nobody holds the conversation meanwhile.
		delay := max(time.Until(wait.NotBefore)+10*time.Millisecond, 10*time.Millisecond)
		w.metrics.waiting.Add(float64(len(batch)))
		log.Debug().Time("not_before", wait.NotBefore).Msg("conversation waits for the model server; delaying triggers")
		nakAll(batch, delay)
	default:
		if w.hardCtx.Err() == nil {
			log.Error().Err(err).Msg("claim")
		}
		nakAll(batch, w.cfg.RetryDelay)
	}
}

// claimed records a claim that took rows: the triggers its rows do not
// cover wait for the next turn, and the turn is announced as processing.
func (t *turn) claimed() {
	w, c := t.w, t.claim
	// Triggers whose rows this claim did not take wait for the next turn:
	// rows a capped turn left pending (in order), or a row whose commit
	// was not visible yet to the claim.
	t.batch = w.keepForNextTurn(t.mb, t.batch, c.OutboxIDs, c.More)
	t.log = t.log.With().Str("run_id", c.RunID).Str("turn_id", c.TurnID).Logger()
	w.metrics.turnsStarted.Inc()
	w.metrics.attempts.Observe(float64(c.Attempts))
	w.metrics.insertToClaim.Observe(time.Since(c.FirstCreatedAt).Seconds())
	w.emit(batonnats.ConversationEvent{ConversationID: c.ConversationID, RunID: c.RunID, TurnID: c.TurnID, Type: batonnats.EventProcessing, OutboxIDs: c.OutboxIDs, MessageID: c.ReplyID()})
	t.log.Debug().Ints64("outbox_ids", c.OutboxIDs).Int("attempt", c.Attempts).Msg("turn claimed")
	w.crash.at(CrashAfterClaim)

	t.span.SetAttributes(attribute.String("baton.turn_id", c.TurnID), attribute.Int("baton.attempt", c.Attempts), attribute.Int("baton.messages", len(c.OutboxIDs)))
	// The turn answers the claimed rows: it links the trace of each
	// request it answers, whichever trigger woke it.
	linked := map[trace.TraceID]bool{t.span.SpanContext().TraceID(): true}
	for _, tp := range c.TraceParents {
		if sc := telemetry.SpanContextOf(tp); sc.IsValid() && !linked[sc.TraceID()] {
			linked[sc.TraceID()] = true
			t.span.AddLink(trace.Link{SpanContext: sc})
		}
	}
}

// errAloneFull: as many claims as may wait for held conversations do.
var errAloneFull = errors.New("too many claims wait for held conversations")

// claimAlone claims p on its own connection, waiting for its conversation
// for at most LockWait: schema.ErrLockWait past that, errAloneFull at once
// when as many claims as may already wait so.
func (w *Worker) claimAlone(p schema.ClaimParams) schema.ClaimResult {
	select {
	case w.alone <- struct{}{}:
		defer func() { <-w.alone }()
	default:
		return schema.ClaimResult{Err: errAloneFull}
	}
	w.metrics.alone.WithLabelValues("claim").Inc()
	var r schema.ClaimResult
	r.Claim, r.Input, r.Err = schema.ClaimTurnWithin(w.hardCtx, w.pool, p, w.cfg.HistoryLimit, w.cfg.LockWait)
	return r
}

// keepForNextTurn puts back into the mailbox the triggers of batch whose
// rows the claim did not take (marked unclaimable, so that they do not
// supersede the turn), and returns the others, which the turn settles.
// After a capped claim (more) the mailbox runs once more even with none to
// put back: the rows left pending need a turn.
func (w *Worker) keepForNextTurn(mb *mailbox, batch []jetstream.Msg, claimed []int64, more bool) []jetstream.Msg {
	var covered, kept []jetstream.Msg
	unclaimable := map[int64]bool{}
	for _, m := range batch {
		if id, ok := outboxIDOf(m); ok && !slices.Contains(claimed, id) {
			kept = append(kept, m)
			unclaimable[id] = true
		} else {
			covered = append(covered, m)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	mb.unclaimable = unclaimable
	if len(kept) == 0 && !more {
		return covered
	}
	mb.waiting = append(kept, mb.waiting...)
	mb.more = true
	mb.since = time.Time{}
	return covered
}

// outboxIDOf reads the outbox row a trigger announces.
func outboxIDOf(m jetstream.Msg) (int64, bool) {
	if v := m.Headers().Get(batonnats.HeaderOutboxID); v != "" {
		if id, err := strconv.ParseInt(v, 10, 64); err == nil {
			return id, true
		}
	}
	t, err := batonnats.ParseTrigger(m.Data())
	return t.OutboxID, err == nil
}

// sessionClaimWait is how long a claim waits for the worker's session to
// be held again before its triggers are delayed.
const sessionClaimWait = time.Second

// awaitSession waits at most wait for the worker's session to be held and
// returns its number (zero, at once, with NoSession); false when it was
// not held in time.
func (w *Worker) awaitSession(ctx context.Context, wait time.Duration) (int32, bool) {
	if w.session == nil {
		return 0, true
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return w.session.await(ctx)
}
