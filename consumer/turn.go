package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
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

// turn is one turn on this worker, from its claim to its end. It reads top
// to bottom: claim (claim.go) the conversation's pending rows, run the
// agent's steps in the tool loop (loop.go) while the lease is renewed
// (lease.go) and newer messages are watched for (debounce.go: they
// supersede or interrupt it, by the conversation's double texting), then end
// (end.go) in one transaction: finalize, park for an approval, supersede,
// or fail. Every trigger of batch is acked once a committed transaction
// covers it, or returned to the group (nak) when nothing did.
type turn struct {
	w     *Worker
	mb    *mailbox
	batch []jetstream.Msg
	log   zerolog.Logger
	span  trace.Span
	runID string

	// Set by the claim.
	claim schema.Claim
	input schema.TurnInput

	// Set when the turn starts running.
	ctx     context.Context
	cancel  context.CancelCauseFunc
	lease   leaseDeadline
	live    *liveRun
	journal *journal
}

// handle claims the conversation for the triggers of batch, runs the turn
// and ends it.
func (w *Worker) handle(mb *mailbox, batch []jetstream.Msg) {
	w.crash.at(CrashBeforeClaim)
	t := w.newTurn(mb, batch)
	defer t.span.End()
	if !t.claimRows() {
		return
	}
	t.run()
}

func (w *Worker) newTurn(mb *mailbox, batch []jetstream.Msg) *turn {
	t := &turn{w: w, mb: mb, batch: batch, runID: "run_" + uuid.Must(uuid.NewV7()).String()}
	t.span = w.turnSpan(batch, mb.conversationID, t.runID)
	log := w.log.With().Str("conversation_id", mb.conversationID)
	if tid := t.span.SpanContext().TraceID(); t.span.SpanContext().HasTraceID() {
		log = log.Str("trace_id", tid.String())
	}
	t.log = log.Logger()
	return t
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

// run runs a claimed turn and ends it in one transaction.
func (t *turn) run() {
	w := t.w
	w.metrics.inFlight.Inc()
	defer w.metrics.inFlight.Dec()
	stopWatching, release := t.start()
	// The turn stays tracked until it ended: a snapshot request while it
	// commits is still answered.
	defer release()
	reply, err := t.answer()
	if err == nil && t.claim.DoubleTexting == schema.DoubleTextingDebounce {
		w.quietWindow(t.ctx, t.mb)
	}
	stopWatching()
	reply, stopped, err := t.outcome(reply, err)

	ctx, cancel := context.WithTimeout(trace.ContextWithSpan(context.WithoutCancel(w.hardCtx), t.span), commitTimeout)
	defer cancel()
	if err != nil {
		t.span.SetStatus(codes.Error, err.Error())
	}
	t.end(ctx, reply, stopped, err)
}

// start gives the turn its context (ended by its deadline, a stop, a lost
// lease, a newer message or the shutdown), its live reply and its journal,
// and starts renewing the lease and watching for newer messages (what a
// newer message does is the conversation's double texting, debounce.go). The
// first function returned stops both and waits for them; the second ends
// the turn's context and its tracking, once the turn ended.
func (t *turn) start() (stopWatching, release func()) {
	w, c := t.w, t.claim
	t.lease.set(c.LeaseExpiresAt)
	ctx, cancel := context.WithCancelCause(withLease(trace.ContextWithSpan(w.hardCtx, t.span), &t.lease))
	t.ctx, t.cancel = ctx, cancel
	// The turn's wall-clock deadline: past it the attempt fails like any
	// other failure, visibly once the attempts are used up.
	deadline := time.AfterFunc(w.cfg.TurnTimeout, func() {
		cancel(fmt.Errorf("%w of %s", ErrTurnTimeout, w.cfg.TurnTimeout))
	})
	t.live = newLiveRun(w.cfg.Live, c.ConversationID, c.RunID, t.log)
	t.journal = &journal{pool: w.pool, tools: w.cfg.Tools, conversationID: c.ConversationID, runID: c.RunID,
		turnID: c.TurnID, epoch: c.Epoch, crash: w.crash, metrics: w.metrics,
		live: t.live, cancel: cancel, log: t.log, resume: c.Resume}
	untrack := w.track(c.ConversationID, c.RunID, t.live, t.journal.stop)
	stopRenewal := t.renewLease()
	stopWatch := t.watchArrivals()
	stopWatching = func() {
		stopWatch()
		stopRenewal()
	}
	release = func() {
		untrack()
		deadline.Stop()
		cancel(nil)
	}
	return stopWatching, release
}

// answer lists the turn's tools and runs its steps.
func (t *turn) answer() (Reply, error) {
	w, c := t.w, t.claim
	tools := w.cfg.Tools
	if w.cfg.ToolSource != nil {
		// The turn's tools are listed once, now, and stay the same for
		// the whole turn.
		listed, err := w.cfg.ToolSource.TurnTools(t.ctx)
		if err != nil {
			return Reply{}, fmt.Errorf("list the turn's tools: %w", err)
		}
		tools = Tools{}
		for n, tool := range w.cfg.Tools {
			tools[n] = tool
		}
		for n, tool := range listed {
			tools[n] = tool
		}
		t.journal.tools = tools
	}
	var journaled []schema.StepRecord
	if c.Journaled {
		var err error
		if journaled, err = schema.LoadSteps(t.ctx, w.pool, c.ConversationID, c.TurnID, c.Epoch); err != nil {
			return Reply{}, err
		}
	}
	w.crash.at(CrashDuringModel)
	ctx, span := telemetry.Tracer().Start(t.ctx, "agent")
	defer span.End()
	l := newLoop(w.cfg.Agent, &Turn{
		ConversationID: c.ConversationID,
		Owner:          c.Owner,
		RunID:          c.RunID,
		TurnID:         c.TurnID,
		Epoch:          c.Epoch,
		Attempt:        c.Attempts,
		Messages:       t.input.Messages,
		History:        t.input.History,
		MoreHistory: pagesOnce(func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error) {
			return schema.LoadHistoryBefore(ctx, w.pool, c.ConversationID, beforeSeq, limit)
		}),
	}, tools, t.journal, t.live, w.cfg.MaxToolIterations, t.log)
	l.resume, l.journaled = resumeOf(c.Resume), journaled
	return l.run(ctx)
}

// outcome is what the turn's end commits: the reply, whether it was
// stopped, or the error that ended the turn, which its context's cause
// overrides (a stop, a lost lease, a newer message, the deadline).
func (t *turn) outcome(reply Reply, err error) (Reply, bool, error) {
	answered := err == nil
	if cause := context.Cause(t.ctx); cause != nil && t.ctx.Err() != nil {
		err = cause
		if t.w.hardCtx.Err() != nil {
			err = errShutdown
		}
	}
	if !errors.Is(err, ErrStopped) {
		return reply, false, err
	}
	// The reply is what the run showed, or the whole answer when the
	// agent had finished (the stop came in the quiet window).
	if !answered {
		reply = t.live.stopped()
	}
	return reply, true, nil
}

// end commits the turn's end: its reply, or what its error calls for.
func (t *turn) end(ctx context.Context, reply Reply, stopped bool, err error) {
	var suspended *Suspended
	switch {
	case err == nil:
		t.w.crash.at(CrashBeforeFinalize)
		t.finalize(ctx, reply, stopped)
	case t.settleLost(ctx, err):
	case errors.As(err, &suspended):
		t.park(ctx, suspended)
	case errors.Is(err, errSuperseded):
		t.supersede(ctx)
	case errors.Is(err, errShutdown):
		t.giveUp(ctx)
	default:
		t.fail(ctx, err)
	}
}

// pagesOnce reads each page of history once per turn: every step of the
// turn may ask for the same pages again.
func pagesOnce(load func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error)) func(context.Context, int64, int) ([]schema.Message, error) {
	type page struct {
		before int64
		limit  int
	}
	read := map[page][]schema.Message{}
	return func(ctx context.Context, beforeSeq int64, limit int) ([]schema.Message, error) {
		p := page{beforeSeq, limit}
		if ms, ok := read[p]; ok {
			return ms, nil
		}
		ms, err := load(ctx, beforeSeq, limit)
		if err != nil {
			return nil, err
		}
		read[p] = ms
		return ms, nil
	}
}
