package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// ToolSource lists the tools of a turn when it starts, such as the tools
// of MCP servers. The set it returns is the turn's for the whole turn: a
// server that changes its list meanwhile changes the next turn's.
type ToolSource interface {
	TurnTools(ctx context.Context) (Tools, error)
}

// ApprovalTool is a Tool whose calls may wait for a person. The journal
// asks before each call of a write: a call that needs approval is not
// sent; the turn stops (see Suspended) and resumes once someone decided.
// Nothing a tool returns or a model says changes the answer: it is the
// operator's policy, fixed when the tool was built.
type ApprovalTool interface {
	Tool
	NeedsApproval() bool
}

// DefinedTool is a Tool with a definition it can change (an MCP
// server's): the SHA-256 of that definition is journaled with each call,
// and an approved call is sent only under the definition it was approved
// with.
type DefinedTool interface {
	Tool
	DefinitionSHA256() string
}

// KeyedTool is a Tool that derives the idempotency key of its calls
// itself, for example with the name of the server that receives it. The
// journal stores the key it returns, and an approved call is sent with the
// key stored when approval was asked.
type KeyedTool interface {
	Tool
	IdempotencyKey(runID, toolCallID string) string
}

// OutcomeUnknownError is a tool's failure after its request may have
// left: a transport error, a timeout, a lost answer. For a write, the
// side effect may have happened: the turn fails visibly and the call is
// never sent again. A tool returns it instead of a failure the model may
// react to.
type OutcomeUnknownError struct {
	Tool string
	Err  error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%s: the call was sent and its outcome is unknown: %v", e.Tool, e.Err)
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// ErrNeedsApproval is what the journal answers a call that waits for a
// person's approval: the agent stops the turn with Suspended.
var ErrNeedsApproval = errors.New("the call waits for a person's approval")

// Suspended is an agent's answer when its turn stopped at a call that
// needs approval (ErrNeedsApproval): State is what the agent needs to go
// on from that call, without asking the model again, when the turn
// resumes (Turn.Resume).
type Suspended struct {
	State json.RawMessage
}

func (s *Suspended) Error() string { return "the turn waits for a person's approval of a call" }

// Resume is a turn that goes on from a call a person decided on.
type Resume struct {
	// ApprovalID is the approval's public id.
	ApprovalID string
	// ToolCallID and Tool are the call that waited.
	ToolCallID string
	Tool       string
	// Status is approved, denied or expired.
	Status string
	// State is what the agent returned in Suspended.
	State json.RawMessage
}

// DeniedError is the journal's answer to a resumed call that a person
// denied, or whose approval expired: the call was not sent. Its text is
// for the model.
type DeniedError struct {
	Tool   string
	Status string
}

func (e *DeniedError) Error() string {
	if e.Status == schema.ApprovalExpired {
		return fmt.Sprintf("the call of %s was not made: nobody approved it in time. Tell the user, and do not call it again unless they ask", e.Tool)
	}
	return fmt.Sprintf("the call of %s was not made: the user denied it. Do not call it again unless the user asks", e.Tool)
}

// NotSentError is the journal's answer to an approved call that could not
// be sent as it was approved (its tool or its arguments changed). Its
// text is for the model.
type NotSentError struct {
	Tool, Why string
}

func (e *NotSentError) Error() string {
	return fmt.Sprintf("the approved call of %s was not made: %s", e.Tool, e.Why)
}

// park stops a turn at the call that waits for approval: the call, the
// agent's state and the approval commit with the rows back to pending and
// the conversation released, in one transaction fenced by the run's lease.
// The triggers are acked: the decision announces the rows again.
//
// A turn that was asked to stop meanwhile does not wait: it ends stopped
// with what it showed, and the call is never journaled.
func (w *Worker) park(ctx context.Context, log zerolog.Logger, mb *mailbox, batch []jetstream.Msg, claim schema.Claim, j *journal, s *Suspended) {
	p := j.parkRequest()
	if p == nil {
		w.failAttempt(ctx, log, batch, claim, errors.New("the agent stopped for an approval that the journal did not ask for"))
		return
	}
	p.TurnID, p.OutboxIDs, p.State, p.TTL = claim.TurnID, claim.OutboxIDs, s.State, w.cfg.ApprovalTTL
	var out schema.Requested
	err := pgx.BeginFunc(ctx, w.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.RequestApprovalTx(ctx, tx, *p)
		return err
	})
	switch {
	case errors.Is(err, schema.ErrStopRequested):
		w.finalize(ctx, log, mb, batch, claim, Reply{Content: j.live.text()}, true)
		return
	case errors.Is(err, schema.ErrConversationDeleted):
		w.cancelled(ctx, log, batch, claim)
		return
	case errors.Is(err, schema.ErrLeaseLost):
		w.abandoned(ctx, log, batch, claim, err)
		return
	case err != nil:
		// Nothing was sent: the attempt fails like any other.
		w.failAttempt(ctx, log, batch, claim, fmt.Errorf("record the approval request: %w", err))
		return
	}
	ackAll(batch)
	w.metrics.turnsFinished.WithLabelValues("waiting_for_approval").Inc()
	expires := out.ExpiresAt
	w.emit(batonnats.ConversationEvent{
		ConversationID: claim.ConversationID, RunID: claim.RunID, TurnID: claim.TurnID,
		Type: batonnats.EventWaitingForApproval, OutboxIDs: claim.OutboxIDs,
		ApprovalID: out.ApprovalID, Tool: p.Operation.Tool, ExpiresAt: &expires,
	})
	log.Info().Str("approval_id", out.ApprovalID).Str("tool", p.Operation.Tool).Time("expires_at", out.ExpiresAt).
		Msg("turn waits for the approval of a call")
}

// resumeOf is the agent's view of a claim's approval.
func resumeOf(r *schema.Resume) *Resume {
	if r == nil {
		return nil
	}
	return &Resume{ApprovalID: r.ApprovalID, ToolCallID: r.ToolCallID, Tool: r.Tool, Status: r.Status, State: r.State}
}

// waitingForApproval acks the triggers of a conversation whose turn waits
// for an approval: nothing can run until someone decides, and the
// decision announces its rows again (or the sweeper does, once it expired).
func (w *Worker) waitingForApproval(log zerolog.Logger, batch []jetstream.Msg, wait *schema.ApprovalWaitError) {
	w.metrics.waiting.Add(float64(len(batch)))
	log.Debug().Str("approval_id", wait.ApprovalID).Time("expires_at", wait.ExpiresAt).Msg("conversation waits for an approval; triggers done with")
	ackAll(batch)
}
