package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// IdempotencyKey of a tool call: stable for one call of one run, different
// for any other, so the system a write tool changes can refuse a repeat.
func IdempotencyKey(runID, toolCallID string) string {
	sum := sha256.Sum256([]byte(runID + "\x00" + toolCallID))
	return "op_" + hex.EncodeToString(sum[:16])
}

// Tools is a set of tools by name.
type Tools map[string]Tool

// Register adds tools, replacing any of the same name.
func (ts Tools) Register(tools ...Tool) Tools {
	for _, t := range tools {
		ts[t.Name()] = t
	}
	return ts
}

// journal is the ToolExecutor of one run: every call is an operations row,
// started (in a transaction fenced by the run's lease,
// schema.StartOperationTx) before the tool runs and completed or failed
// after, so recovery knows whether an interrupted attempt may have had a
// side effect.
type journal struct {
	pool           *pgxpool.Pool
	tools          Tools
	conversationID string
	runID          string
	crash          *crasher
	metrics        *metrics
	// live shows each call to live clients: its input once journaled as
	// started, then its output or that it failed.
	live *liveRun
	// cancel ends the turn (its context's cause).
	cancel context.CancelCauseFunc
	log    zerolog.Logger

	// mu orders a write's start against superseding: once a write has
	// started, the turn must end with its own reply or error; once the
	// turn is being superseded, no write starts. It also holds a stop back
	// while a write runs (writing), so that the write's outcome is known
	// and journaled before the turn ends.
	mu         sync.Mutex
	wrote      bool
	superseded bool
	writing    int
	stopAsked  bool
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
	if !ok {
		return "", fmt.Errorf("%w %q", ErrUnknownTool, call.Tool)
	}
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	if tool.Effect() == EffectWrite {
		j.mu.Lock()
		switch {
		case j.superseded:
			j.mu.Unlock()
			return "", errSuperseded
		case j.stopAsked || context.Cause(ctx) == ErrStopped:
			j.mu.Unlock()
			return "", ErrStopped
		}
		j.wrote = true
		j.writing++
		j.mu.Unlock()
		defer j.wroteOne()
	}
	inv := Invocation{
		IdempotencyKey: IdempotencyKey(j.runID, call.ID),
		ConversationID: j.conversationID,
		RunID:          j.runID,
		Arguments:      args,
	}
	err := pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		var err error
		inv.OperationID, err = schema.StartOperationTx(ctx, tx, schema.Operation{
			RunID:          j.runID,
			ConversationID: j.conversationID,
			ToolCallID:     call.ID,
			Tool:           tool.Name(),
			ToolVersion:    tool.Version(),
			Effect:         tool.Effect(),
			IdempotencyKey: inv.IdempotencyKey,
			Arguments:      string(inv.Arguments),
		})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("journal operation %s (%s): %w", call.ID, call.Tool, err)
	}
	if j.live != nil {
		j.live.toolInput(call.ID, tool.Name(), args)
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
		if err := schema.FailOperation(finishCtx, j.pool, inv.OperationID, callErr.Error()); err != nil {
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
