package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/internal/telemetry"
	"github.com/batonhq/baton/schema"
)

// journal is the ToolExecutor of one run, and the journal of its turn's
// steps: each step that asks for tools is journaled (schema.RecordStepTx)
// before its calls are sent, and every call is an operations row of the
// turn, started (in a transaction fenced by the run's lease,
// schema.StartOperationTx) before the tool runs and completed, failed or
// unknown after, so that a re-claim goes on from the first step without
// an answer and recovery knows whether an interrupted attempt may have had
// a side effect.
type journal struct {
	pool           *pgxpool.Pool
	tools          Tools
	conversationID string
	runID          string
	turnID         string
	epoch          int
	// step is the step whose calls run now.
	step    int
	crash   *crasher
	metrics *metrics
	// live shows each call to live clients: its input once journaled as
	// started, then its output or that it failed.
	live *liveRun
	// cancel ends the turn (its context's cause).
	cancel context.CancelCauseFunc
	log    zerolog.Logger

	// resume is the decided approval the turn resumes from, until its
	// call was answered.
	resume *schema.Resume

	// mu orders a write's start against superseding: once a write has
	// started (or waits for approval), the turn must end with its own
	// reply, error or approval request; once the turn is being
	// superseded, no write starts. It also holds a stop back while a
	// write runs (writing), so that the write's outcome is known and
	// journaled before the turn ends.
	mu         sync.Mutex
	wrote      bool
	superseded bool
	writing    int
	stopAsked  bool
	// pending is the call that waits for approval, once one does.
	pending *pendingCall
}

// stop ends the turn with ErrStopped: at once, or, while a write runs, as
// soon as it returned. A stopped turn never runs again, so the write is
// never repeated; letting it finish keeps its outcome known.
func (j *journal) stop() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.writing > 0 {
		if !j.stopAsked {
			j.log.Info().Msg("stop asked while a write runs; the turn stops once it returned")
		}
		j.stopAsked = true
		return
	}
	j.cancel(ErrStopped)
}

// wroteOne ends a write's hold on a stop.
func (j *journal) wroteOne() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.writing--
	if j.writing == 0 && j.stopAsked {
		j.cancel(ErrStopped)
	}
}

// startWrite records that a write starts, unless the turn is superseded
// or stopped (then its error, and nothing may be sent); a started write
// holds a stop back until done is called.
func (j *journal) startWrite(ctx context.Context) (done func(), err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.superseded:
		return nil, errSuperseded
	case j.stopAsked || context.Cause(ctx) == ErrStopped:
		return nil, ErrStopped
	}
	j.wrote = true
	j.writing++
	return j.wroteOne, nil
}

// errSuperseded ends a turn that newer messages of its conversation
// replace before it did anything that cannot be repeated.
var errSuperseded = errors.New("newer messages of the conversation arrived: the turn is answered again with them")

// supersede closes the journal to writes and reports true, unless a write
// has started already.
func (j *journal) supersede() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.wrote {
		return false
	}
	j.superseded = true
	return true
}

func (j *journal) Call(ctx context.Context, call ToolCall) (string, error) {
	tool, ok := j.tools[call.Tool]
	if r := j.resume; r != nil && call.ID == r.ToolCallID {
		return j.resumed(ctx, call, tool)
	}
	if !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownTool, call.Tool)
	}
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	approval := tool.Effect() == EffectWrite && needsApproval(tool)
	if tool.Effect() == EffectWrite {
		done, err := j.startWrite(ctx)
		if err != nil {
			return "", err
		}
		defer done()
		if approval {
			j.mu.Lock()
			j.pending = &pendingCall{call: call, tool: tool, args: args}
			j.mu.Unlock()
		}
	}
	if approval {
		// Nothing is journaled yet: the park that the agent's Suspended
		// leads to journals the call with the approval, in one
		// transaction.
		return "", ErrNeedsApproval
	}
	inv := Invocation{
		IdempotencyKey: idempotencyKey(tool, TurnScope(j.conversationID, j.turnID, j.epoch), call.ID),
		ConversationID: j.conversationID,
		RunID:          j.runID,
		Arguments:      args,
	}
	return startAndRun(ctx, j, call, tool, inv)
}

// startAndRun commits a call as started, and only then sends it. It is a
// variable only so that the chaos harness can prove it fails a worker
// that sends a call before its journal: a build with the chaosbroken tag
// replaces it, and no other code does.
var startAndRun = func(ctx context.Context, j *journal, call ToolCall, tool Tool, inv Invocation) (string, error) {
	if err := j.start(ctx, call, tool, &inv); err != nil {
		return "", err
	}
	return j.run(ctx, call, tool, inv)
}

// start journals a call as started, in a transaction fenced by the run's
// lease, and sets inv.OperationID.
func (j *journal) start(ctx context.Context, call ToolCall, tool Tool, inv *Invocation) error {
	err := pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		var err error
		inv.OperationID, _, err = schema.StartOperationHashedTx(ctx, tx, schema.Operation{
			RunID:            j.runID,
			ConversationID:   j.conversationID,
			TurnID:           j.turnID,
			Epoch:            j.epoch,
			Step:             j.step,
			ToolCallID:       call.ID,
			Tool:             tool.Name(),
			ToolVersion:      tool.Version(),
			Effect:           tool.Effect(),
			IdempotencyKey:   inv.IdempotencyKey,
			Arguments:        string(inv.Arguments),
			DefinitionSHA256: definitionSHA256(tool),
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("journal operation %s (%s): %w", call.ID, call.Tool, err)
	}
	return nil
}

// run sends a journaled call and journals its outcome, showing both to
// live clients.
func (j *journal) run(ctx context.Context, call ToolCall, tool Tool, inv Invocation) (string, error) {
	if j.live != nil {
		j.live.toolInput(call.ID, tool.Name(), inv.Arguments)
	}
	tctx, span := telemetry.Tracer().Start(ctx, "tool "+call.Tool,
		trace.WithAttributes(attribute.String("baton.tool", call.Tool), attribute.String("baton.effect", string(tool.Effect())), attribute.Int64("baton.operation_id", inv.OperationID)))
	result, callErr := tool.Call(tctx, inv)
	if callErr != nil {
		span.SetStatus(codes.Error, callErr.Error())
	}
	span.End()
	// The outcome is journaled even when the turn's context ended: a
	// completed write must show as completed to recovery.
	finishCtx := context.WithoutCancel(ctx)
	if callErr != nil {
		record := schema.FailOperation
		var unknown *OutcomeUnknownError
		if errors.As(callErr, &unknown) {
			// Sent, and no answer: for a write, it may have taken effect,
			// and the journal must never send it again.
			record = schema.UnknownOperation
		}
		if err := record(finishCtx, j.pool, inv.OperationID, callErr.Error()); err != nil {
			return "", err
		}
		j.metrics.operations.WithLabelValues(call.Tool, "failed").Inc()
		if j.live != nil {
			j.live.toolOutput(call.ID, "", true)
		}
		return "", callErr
	}
	if err := schema.CompleteOperation(finishCtx, j.pool, inv.OperationID, result); err != nil {
		return "", err
	}
	j.metrics.operations.WithLabelValues(call.Tool, "completed").Inc()
	if j.live != nil {
		j.live.toolOutput(call.ID, result, false)
	}
	j.crash.at(CrashAfterTool)
	return result, nil
}

// resumed answers the call a resumed turn stopped at: a denied or expired
// one is not sent; an approved one is sent with exactly the arguments
// stored when approval was asked (their hash checked again), its stored
// idempotency key, and only under the tool definition it was approved
// with.
func (j *journal) resumed(ctx context.Context, call ToolCall, tool Tool) (string, error) {
	r := j.resume
	j.resume = nil
	if r.Status != schema.ApprovalApproved {
		if j.live != nil {
			j.live.toolDenied(call.ID, call.Tool, call.Arguments)
		}
		return "", &DeniedError{Tool: call.Tool, Status: r.Status}
	}
	done, err := j.startWrite(ctx)
	if errors.Is(err, ErrStopped) {
		// The turn was stopped before the call left: it never will.
		if err := schema.DenyOperation(context.WithoutCancel(ctx), j.pool, r.OperationID, "not sent: the turn was stopped"); err != nil {
			return "", err
		}
		return "", err
	}
	if err != nil {
		return "", err
	}
	defer done()
	if tool == nil || tool.Name() != r.Tool || definitionSHA256(tool) != r.DefinitionSHA256 {
		cause := "not sent: the tool changed or is not offered any more since the approval"
		if err := schema.DenyOperation(context.WithoutCancel(ctx), j.pool, r.OperationID, cause); err != nil {
			return "", err
		}
		j.showNotSent(call)
		return "", &NotSentError{Tool: call.Tool, Why: "the tool changed after it was approved; ask the user again if it is still needed"}
	}
	inv := Invocation{
		OperationID:    r.OperationID,
		IdempotencyKey: r.IdempotencyKey,
		ConversationID: j.conversationID,
		RunID:          j.runID,
	}
	err = pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		args, err := schema.StartApprovedOperationTx(ctx, tx, j.conversationID, j.runID, r.OperationID, r.ArgumentsSHA256)
		inv.Arguments = json.RawMessage(args)
		return err
	})
	if errors.Is(err, schema.ErrArgumentsChanged) {
		cause := "not sent: its stored arguments do not match the ones approved"
		if err := schema.DenyOperation(context.WithoutCancel(ctx), j.pool, r.OperationID, cause); err != nil {
			return "", err
		}
		j.showNotSent(call)
		return "", &NotSentError{Tool: call.Tool, Why: "its arguments are not the ones that were approved"}
	}
	if err != nil {
		return "", fmt.Errorf("journal approved operation %s (%s): %w", call.ID, call.Tool, err)
	}
	return j.run(ctx, call, tool, inv)
}

// showNotSent shows live clients an approved call that could not be sent
// as it was approved: it failed.
func (j *journal) showNotSent(call ToolCall) {
	if j.live != nil {
		j.live.toolInput(call.ID, call.Tool, call.Arguments)
		j.live.toolOutput(call.ID, "", true)
	}
}

// parkRequest is the approval request of the call that waits, for park.
func (j *journal) parkRequest() *schema.ApprovalRequest {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.pending
	if p == nil {
		return nil
	}
	return &schema.ApprovalRequest{
		ConversationID: j.conversationID,
		RunID:          j.runID,
		Operation: schema.Operation{
			RunID:            j.runID,
			ConversationID:   j.conversationID,
			TurnID:           j.turnID,
			Epoch:            j.epoch,
			Step:             j.step,
			ToolCallID:       p.call.ID,
			Tool:             p.tool.Name(),
			ToolVersion:      p.tool.Version(),
			Effect:           p.tool.Effect(),
			IdempotencyKey:   idempotencyKey(p.tool, TurnScope(j.conversationID, j.turnID, j.epoch), p.call.ID),
			Arguments:        string(p.args),
			DefinitionSHA256: definitionSHA256(p.tool),
		},
	}
}

// pendingCall is a call that waits for approval.
type pendingCall struct {
	call ToolCall
	tool Tool
	args json.RawMessage
}

// recordStep journals a step that asks for tools, before any of its calls
// is sent (see stepJournal).
func (j *journal) recordStep(ctx context.Context, index int, step Step) error {
	j.step = index
	step.Results = nil
	answer, err := json.Marshal(step)
	if err != nil {
		return fmt.Errorf("journal step %d: %w", index, err)
	}
	err = schema.RecordStep(ctx, j.pool, schema.StepParams{ConversationID: j.conversationID, RunID: j.runID,
		TurnID: j.turnID, Epoch: j.epoch, Step: index, Answer: answer})
	if errors.Is(err, schema.ErrStepJournaled) {
		// This run journaled it already; its calls go on.
		return nil
	}
	return err
}

// atStep says which journaled step's calls run now.
func (j *journal) atStep(index int) { j.step = index }

// wroteBefore records that an earlier run of the turn wrote: the turn can
// no longer be superseded.
func (j *journal) wroteBefore() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.wrote = true
}
