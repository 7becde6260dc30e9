package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// commitTimeout bounds the transactions that end a turn. They run even when
// the turn's context has ended: an answer that exists is worth committing,
// and a failure must be recorded.
const commitTimeout = 15 * time.Second

// handle claims the conversation for the triggers of batch, runs the turn
// and ends it. Every trigger of batch is acked once a committed transaction
// covers it, or returned to the group (nak) when nothing did.
func (w *Worker) handle(mb *mailbox, batch []jetstream.Msg) {
	log := w.log.With().Str("conversation_id", mb.conversationID).Logger()
	w.crash.at(CrashBeforeClaim)

	runID := "run_" + uuid.Must(uuid.NewV7()).String()
	span := w.turnSpan(batch, mb.conversationID, runID)
	defer span.End()
	if tid := span.SpanContext().TraceID(); span.SpanContext().HasTraceID() {
		log = log.With().Str("trace_id", tid.String()).Logger()
	}
	session, ok := w.awaitSession(w.hardCtx, sessionClaimWait)
	if !ok {
		// Claimed now, the run would look like a gone worker's and be
		// taken over at once: its triggers come back once the session
		// may be held again.
		log.Debug().Msg("worker session not held; delaying triggers")
		nakAll(batch, w.cfg.RetryDelay)
		return
	}
	_, claimSpan := telemetry.Tracer().Start(trace.ContextWithSpan(w.hardCtx, span), "claim")
	// One statement claims a free conversation and loads the turn, with
	// the claims of other conversations that are ready at the same time.
	// That statement waits for no conversation: one that another
	// transaction holds, or whose expired run must be recovered first, is
	// claimed here on its own, so that only this turn waits for it, for at
	// most LockWait.
	p := schema.ClaimParams{
		ConversationID: mb.conversationID,
		RunID:          runID,
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
	claim, in, err := res.Claim, res.Input, res.Err
	claimSpan.End()
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
		return
	case errors.Is(err, schema.ErrConversationDeleted):
		ackAll(batch)
		return
	case errors.Is(err, schema.ErrLockWait):
		// Another transaction holds the conversation: look again later,
		// holding nothing meanwhile.
		w.metrics.busy.Add(float64(len(batch)))
		log.Info().Dur("lock_wait", w.cfg.LockWait).Msg("conversation held by another transaction; delaying triggers")
		nakAll(batch, w.cfg.BusyDelay)
		return
	case errors.Is(err, errAloneFull):
		w.metrics.busy.Add(float64(len(batch)))
		log.Debug().Msg("too many claims wait for held conversations; delaying triggers")
		nakAll(batch, w.cfg.LockWait)
		return
	case errors.As(err, &approvalWait):
		w.waitingForApproval(log, batch, approvalWait)
		return
	case errors.As(err, &wait):
		// The model server asked to wait: the triggers come back when the
		// wait is over, and nobody holds the conversation meanwhile.
		delay := max(time.Until(wait.NotBefore)+10*time.Millisecond, 10*time.Millisecond)
		w.metrics.waiting.Add(float64(len(batch)))
		log.Debug().Time("not_before", wait.NotBefore).Msg("conversation waits for the model server; delaying triggers")
		nakAll(batch, delay)
		return
	case err != nil:
		if w.hardCtx.Err() == nil {
			log.Error().Err(err).Msg("claim")
		}
		nakAll(batch, w.cfg.RetryDelay)
		return
	}
	if r := claim.Recovered; r != nil {
		w.recovered(*r)
	}
	if claim.Empty() {
		// Redelivered or re-announced triggers whose rows another turn
		// already covered.
		w.metrics.deduplicated.Add(float64(len(batch)))
		ackAll(batch)
		return
	}
	// Triggers whose rows this claim did not take wait for the next turn:
	// rows a capped turn left pending (in order), or a row whose commit
	// was not visible yet to the claim.
	batch = w.keepForNextTurn(mb, batch, claim.OutboxIDs, claim.More)
	log = log.With().Str("run_id", claim.RunID).Str("turn_id", claim.TurnID).Logger()
	w.metrics.turnsStarted.Inc()
	w.metrics.attempts.Observe(float64(claim.Attempts))
	w.metrics.insertToClaim.Observe(time.Since(claim.FirstCreatedAt).Seconds())
	w.emit(batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: batonnats.EventProcessing, OutboxIDs: claim.OutboxIDs, MessageID: claim.ReplyID()})
	log.Debug().Ints64("outbox_ids", claim.OutboxIDs).Int("attempt", claim.Attempts).Msg("turn claimed")
	w.crash.at(CrashAfterClaim)

	w.metrics.inFlight.Inc()
	defer w.metrics.inFlight.Dec()
	span.SetAttributes(attribute.String("baton.turn_id", claim.TurnID), attribute.Int("baton.attempt", claim.Attempts), attribute.Int("baton.messages", len(claim.OutboxIDs)))
	// The turn answers the claimed rows: it links the trace of each
	// request it answers, whichever trigger woke it.
	linked := map[trace.TraceID]bool{span.SpanContext().TraceID(): true}
	for _, tp := range claim.TraceParents {
		if sc := telemetry.SpanContextOf(tp); sc.IsValid() && !linked[sc.TraceID()] {
			linked[sc.TraceID()] = true
			span.AddLink(trace.Link{SpanContext: sc})
		}
	}
	w.runTurn(trace.ContextWithSpan(context.Background(), span), log, mb, batch, claim, in)
}

// turnSpan starts the span of a turn in the trace of the first trigger
// that carries one; the traces of the other requests the turn answers are
// linked once the claim says which rows it answers.
func (w *Worker) turnSpan(batch []jetstream.Msg, conversationID, runID string) trace.Span {
	parent := context.Background()
	for _, m := range batch {
		if tp := m.Headers().Get(batonnats.HeaderTraceParent); telemetry.SpanContextOf(tp).IsValid() {
			parent = telemetry.FromTraceParent(parent, tp)
			break
		}
	}
	_, span := telemetry.Tracer().Start(parent, "turn", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("baton.conversation_key", conversationID), attribute.String("baton.run_id", runID)))
	return span
}

// errShutdown ends turns still running at the shutdown deadline.
var errShutdown = errors.New("worker is shutting down")

// runTurn runs a claimed turn and ends it in one transaction.
func (w *Worker) runTurn(spanCtx context.Context, log zerolog.Logger, mb *mailbox, batch []jetstream.Msg, claim schema.Claim, in schema.TurnInput) {
	var stopped bool
	turnCtx, cancel := context.WithCancelCause(trace.ContextWithSpan(w.hardCtx, trace.SpanFromContext(spanCtx)))
	defer cancel(nil)
	// The turn's wall-clock deadline: past it the attempt fails like any
	// other failure, visibly once the attempts are used up.
	deadline := time.AfterFunc(w.cfg.TurnTimeout, func() {
		cancel(fmt.Errorf("%w of %s", ErrTurnTimeout, w.cfg.TurnTimeout))
	})
	defer deadline.Stop()
	live := newLiveRun(w.cfg.Live, claim.ConversationID, claim.RunID, log)
	j := &journal{pool: w.cfg.Pool, tools: w.cfg.Tools, conversationID: claim.ConversationID, runID: claim.RunID, crash: w.crash, metrics: w.metrics,
		live: live, cancel: cancel, log: log, resume: claim.Resume}
	untrack := w.track(claim.ConversationID, claim.RunID, live, j.stop)
	defer untrack()
	stopRenewal := w.renewLease(turnCtx, cancel, j.stop, log, mb, batch, claim)
	stopWatch := w.watchArrivals(turnCtx, cancel, mb, claim, j)

	reply, err := func() (Reply, error) {
		var turnTools Tools
		if w.cfg.ToolSource != nil {
			// The turn's tools are listed once, now, and stay the same
			// for the whole turn.
			ts, err := w.cfg.ToolSource.TurnTools(turnCtx)
			if err != nil {
				return Reply{}, fmt.Errorf("list the turn's tools: %w", err)
			}
			turnTools = Tools{}
			for n, t := range w.cfg.Tools {
				turnTools[n] = t
			}
			for n, t := range ts {
				turnTools[n] = t
			}
			j.tools = turnTools
		}
		w.crash.at(CrashDuringModel)
		actx, span := telemetry.Tracer().Start(turnCtx, "agent")
		defer span.End()
		return w.cfg.Agent.Run(actx, Turn{
			Tools:          turnTools,
			Resume:         resumeOf(claim.Resume),
			ConversationID: claim.ConversationID,
			RunID:          claim.RunID,
			TurnID:         claim.TurnID,
			Attempt:        claim.Attempts,
			Messages:       in.Messages,
			History:        in.History,
			Live:           live,
			MoreHistory: func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error) {
				return schema.LoadHistoryBefore(ctx, w.cfg.Pool, claim.ConversationID, beforeSeq, limit)
			},
		}, j)
	}()
	if err == nil {
		w.quietWindow(turnCtx, mb)
	}
	stopWatch()
	stopRenewal()
	answered := err == nil
	if cause := context.Cause(turnCtx); cause != nil && turnCtx.Err() != nil {
		err = cause
		if w.hardCtx.Err() != nil {
			err = errShutdown
		}
	}
	if errors.Is(err, ErrStopped) {
		// The reply is what the run showed, or the whole answer when the
		// agent had finished (the stop came in the quiet window).
		if !answered {
			reply = Reply{Content: live.text()}
		}
		err = nil
		stopped = true
	}

	ctx, cancelCommit := context.WithTimeout(trace.ContextWithSpan(context.WithoutCancel(w.hardCtx), trace.SpanFromContext(spanCtx)), commitTimeout)
	defer cancelCommit()
	if err != nil {
		trace.SpanFromContext(spanCtx).SetStatus(codes.Error, err.Error())
	}
	if err == nil {
		w.crash.at(CrashBeforeFinalize)
		w.finalize(ctx, log, mb, batch, claim, reply, stopped)
		return
	}
	var suspended *Suspended
	switch {
	case errors.As(err, &suspended):
		w.park(ctx, log, mb, batch, claim, j, suspended)
	case errors.Is(err, errSuperseded):
		w.supersede(ctx, log, mb, batch, claim, live)
	case errors.Is(err, schema.ErrConversationDeleted):
		w.cancelled(ctx, log, batch, claim)
	case errors.Is(err, schema.ErrLeaseLost):
		w.abandoned(ctx, log, batch, claim, err)
	case errors.Is(err, errShutdown):
		w.giveUp(ctx, log, batch, claim)
	default:
		w.failAttempt(ctx, log, batch, claim, err)
	}
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
		return schema.FinalizeTurn(ctx, w.cfg.Pool, f)
	}
	return r.Finalized, r.Err
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
	r.Claim, r.Input, r.Err = schema.ClaimTurnWithin(w.hardCtx, w.cfg.Pool, p, w.cfg.HistoryLimit, w.cfg.LockWait)
	return r
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

// finalize commits the reply (stopped: what a stopped turn showed), then
// acks.
func (w *Worker) finalize(ctx context.Context, log zerolog.Logger, mb *mailbox, batch []jetstream.Msg, claim schema.Claim, reply Reply, stopped bool) {
	if _, ok := w.awaitSession(ctx, commitTimeout); !ok {
		// A worker that lost its session finalizes nothing until it holds
		// it again: another may be taking its runs over meanwhile.
		log.Error().Msg("finalize: the worker session was not held again within the commit deadline")
		w.metrics.turnsFinished.WithLabelValues("error").Inc()
		nakAll(batch, w.cfg.RetryDelay)
		return
	}
	fctx, span := telemetry.Tracer().Start(ctx, "finalize")
	out, err := commitFinalize(fctx, w, schema.Finalize{
		ConversationID: claim.ConversationID,
		RunID:          claim.RunID,
		TurnID:         claim.TurnID,
		OutboxIDs:      claim.OutboxIDs,
		Generation:     claim.Generation,
		Content:        reply.Content,
		Truncated:      reply.Truncated,
		Stopped:        stopped,
		// A capped turn leaves pending rows for the next one on purpose:
		// they never supersede it.
		SupersedeIfNewer: w.cfg.Debounce > 0 && !claim.More && !stopped,
	})
	span.End()
	if err == nil && out.Superseded {
		w.superseded(log, mb, batch, claim)
		return
	}
	switch {
	case errors.Is(err, schema.ErrConversationDeleted):
		w.cancelled(ctx, log, batch, claim)
		return
	case errors.Is(err, schema.ErrLeaseLost):
		w.abandoned(ctx, log, batch, claim, err)
		return
	case err != nil:
		// The lease still holds the rows: recovery resolves them once it
		// expires, and the triggers come back before that.
		log.Error().Err(err).Msg("finalize")
		w.metrics.turnsFinished.WithLabelValues("error").Inc()
		nakAll(batch, w.cfg.RetryDelay)
		return
	}
	w.crash.at(CrashAfterFinalizeBeforeAck)
	ackAll(batch)
	outcome, event := "replied", batonnats.EventReplied
	if out.Stopped {
		outcome, event = "stopped", batonnats.EventStopped
	}
	w.metrics.turnsFinished.WithLabelValues(outcome).Inc()
	w.metrics.insertToFinal.Observe(time.Since(claim.FirstCreatedAt).Seconds())
	w.emit(batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: event, OutboxIDs: claim.OutboxIDs, MessageID: out.MessageID})
	log.Debug().Str("message_id", out.MessageID).Int64("operations", out.Operations).Str("outcome", outcome).Msg("turn finalized")
}

// watchArrivals supersedes the running turn when a trigger of a newer
// message of its conversation arrives on this worker before the turn
// started a write: the model call is cancelled and the next turn answers
// all the messages together. Newer messages that arrive at another worker
// are caught at finalize (Finalize.SupersedeIfNewer). The returned
// function stops the watch and waits for it.
func (w *Worker) watchArrivals(ctx context.Context, cancel context.CancelCauseFunc, mb *mailbox, claim schema.Claim, j *journal) func() {
	if w.cfg.Debounce <= 0 || claim.More {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-mb.arrived:
			}
			if w.newerTrigger(mb, claim) && j.supersede() {
				cancel(errSuperseded)
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-done
	}
}

// newerTrigger reports whether the mailbox holds a trigger of a row the
// claim did not take.
func (w *Worker) newerTrigger(mb *mailbox, claim schema.Claim) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range mb.waiting {
		if id, ok := outboxIDOf(m); ok && !slices.Contains(claim.OutboxIDs, id) && !mb.unclaimable[id] {
			return true
		}
	}
	return false
}

// quietWindow holds a reply until Debounce has passed since the newest
// message of its conversation arrived, so that a message sent right after
// it supersedes the turn instead of getting a turn of its own: a burst
// gets one reply. A real model call takes longer than the window, so a
// lone message waits for nothing; its model call starts at once either way.
func (w *Worker) quietWindow(ctx context.Context, mb *mailbox) {
	if w.cfg.Debounce <= 0 {
		return
	}
	w.mu.Lock()
	wait := time.Until(mb.lastArrival.Add(w.cfg.Debounce))
	w.mu.Unlock()
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// supersede hands a turn back after its model call was cancelled for a
// newer message; a turn that was asked to stop meanwhile ends stopped
// instead, with what it showed.
func (w *Worker) supersede(ctx context.Context, log zerolog.Logger, mb *mailbox, batch []jetstream.Msg, claim schema.Claim, live *liveRun) {
	var done bool
	err := pgx.BeginFunc(ctx, w.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		done, err = schema.SupersedeTx(ctx, tx, claim.ConversationID, claim.RunID, claim.OutboxIDs, false)
		return err
	})
	switch {
	case errors.Is(err, schema.ErrStopRequested):
		w.finalize(ctx, log, mb, batch, claim, Reply{Content: live.text()}, true)
	case errors.Is(err, schema.ErrConversationDeleted):
		w.cancelled(ctx, log, batch, claim)
	case errors.Is(err, schema.ErrLeaseLost):
		w.abandoned(ctx, log, batch, claim, err)
	case err != nil:
		// The lease still holds the rows: recovery hands them back once it
		// expires, and the triggers come back before that.
		log.Error().Err(err).Msg("supersede")
		nakAll(batch, w.cfg.RetryDelay)
	case !done:
		// A write started after all (recorded before the journal closed):
		// the turn can no longer be repeated; recovery rules once the
		// lease expires, and the attempt fails visibly.
		w.failAttempt(ctx, log, batch, claim, errSuperseded)
	default:
		w.superseded(log, mb, batch, claim)
	}
}

// superseded puts a handed-back turn's triggers back into its mailbox,
// which claims again at once: the next turn takes the handed-back rows
// with the newer ones.
func (w *Worker) superseded(log zerolog.Logger, mb *mailbox, batch []jetstream.Msg, claim schema.Claim) {
	w.mu.Lock()
	mb.waiting = append(batch, mb.waiting...)
	mb.more = true
	w.mu.Unlock()
	w.metrics.turnsFinished.WithLabelValues("superseded").Inc()
	w.emit(batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: batonnats.EventPending, OutboxIDs: claim.OutboxIDs})
	log.Debug().Msg("turn superseded by newer messages; claiming again")
}

// cancelled ends a turn whose conversation was deleted: its result is
// discarded and nothing is recreated; the triggers are done with.
func (w *Worker) cancelled(ctx context.Context, log zerolog.Logger, batch []jetstream.Msg, claim schema.Claim) {
	// The run's row went with the conversation; this records nothing
	// unless it survived.
	_ = schema.MarkRun(ctx, w.cfg.Pool, claim.RunID, "cancelled", "conversation deleted during the turn")
	ackAll(batch)
	w.metrics.turnsFinished.WithLabelValues("cancelled").Inc()
	w.emit(batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: batonnats.EventCancelled, OutboxIDs: claim.OutboxIDs})
	log.Info().Msg("conversation deleted during the turn; result discarded")
}

// abandoned ends a turn that lost its lease: whoever took the conversation
// over owns the rows now. The triggers go back, since a trigger only means
// "look at this conversation".
func (w *Worker) abandoned(ctx context.Context, log zerolog.Logger, batch []jetstream.Msg, claim schema.Claim, cause error) {
	if err := schema.MarkRun(ctx, w.cfg.Pool, claim.RunID, "abandoned", cause.Error()); err != nil {
		log.Warn().Err(err).Msg("record abandoned run")
	}
	nakAll(batch, w.cfg.BusyDelay)
	w.metrics.turnsFinished.WithLabelValues("abandoned").Inc()
	log.Warn().Err(cause).Msg("turn abandoned")
}

// failAttempt records a failed attempt: back to pending and announced again
// under the cap, a visible error at it, in one transaction.
func (w *Worker) failAttempt(ctx context.Context, log zerolog.Logger, batch []jetstream.Msg, claim schema.Claim, cause error) {
	w.metrics.failures.WithLabelValues(failureReason(cause)).Inc()
	var out schema.FailOutcome
	err := pgx.BeginFunc(ctx, w.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.FailAttemptTx(ctx, tx, schema.Failure{
			ConversationID: claim.ConversationID,
			RunID:          claim.RunID,
			TurnID:         claim.TurnID,
			OutboxIDs:      claim.OutboxIDs,
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
	case errors.Is(err, schema.ErrConversationDeleted):
		w.cancelled(ctx, log, batch, claim)
		return
	case errors.Is(err, schema.ErrLeaseLost):
		w.abandoned(ctx, log, batch, claim, err)
		return
	case err != nil:
		log.Error().Err(err).AnErr("attempt_error", cause).Msg("record failed attempt")
		nakAll(batch, w.cfg.RetryDelay)
		return
	}
	// The announcement committed with the rows: the triggers in hand are
	// done with either way.
	ackAll(batch)
	if out.GaveUp {
		w.metrics.turnsFinished.WithLabelValues("failed").Inc()
		w.emit(batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: batonnats.EventFailed, OutboxIDs: claim.OutboxIDs, MessageID: out.ErrorMessageID})
		log.Warn().Err(cause).Int("attempts", out.Attempts).Msg("turn failed; error shown in the conversation")
		return
	}
	w.metrics.turnsFinished.WithLabelValues("retried").Inc()
	ev := batonnats.ConversationEvent{ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID, Type: batonnats.EventPending, OutboxIDs: claim.OutboxIDs}
	if !out.NotBefore.IsZero() {
		ev.Type, ev.NotBefore = batonnats.EventWaiting, &out.NotBefore
		log.Info().Err(cause).Int("attempts", out.Attempts).Time("not_before", out.NotBefore).Msg("the model server asked to wait; the next attempt waits for it")
	} else {
		log.Info().Err(cause).Int("attempts", out.Attempts).Msg("attempt failed; turn announced again")
	}
	w.emit(ev)
}

// giveUp ends a turn cut short by shutdown with the recovery rule, at once
// rather than after the lease: back to pending and announced, or failed
// visibly after a started write.
func (w *Worker) giveUp(ctx context.Context, log zerolog.Logger, batch []jetstream.Msg, claim schema.Claim) {
	var r schema.Recovery
	err := pgx.BeginFunc(ctx, w.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		r, err = schema.RecoverRunTx(ctx, tx, claim.ConversationID, claim.RunID, w.cfg.MaxAttempts, schema.RecoveryReasonShutdown)
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonRetry, r.RetryIDs)
	})
	if err != nil {
		// The lease expires and another worker recovers the run.
		log.Error().Err(err).Msg("give up turn at shutdown")
	} else {
		w.recovered(r)
	}
	nakAll(batch, 0)
	w.metrics.turnsFinished.WithLabelValues("abandoned").Inc()
	log.Info().Str("outcome", r.Outcome).Msg("turn given up at shutdown")
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

// ErrTurnTimeout ends a turn that ran past Config.TurnTimeout.
var ErrTurnTimeout = errors.New("the turn ran past its deadline")

// userText is the short explanation for the user that an agent error
// offers (a UserText() string method), or none.
func userText(cause error) string {
	var u interface{ UserText() string }
	if errors.As(cause, &u) {
		return u.UserText()
	}
	return ""
}

// keepForNextTurn puts back into the mailbox the triggers of batch whose
// rows the claim did not take (marked unclaimable, so that they do not
// supersede the turn), and returns the others, which the turn settles. After a capped claim (more) the mailbox runs once more even
// with none to put back: the rows left pending need a turn.
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
