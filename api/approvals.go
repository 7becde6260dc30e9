package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// maxApprovalsListed is how many approvals one listing returns, newest
// first.
const maxApprovalsListed = 100

// listApprovals serves a conversation's approvals, newest first: the
// calls its turns stopped at, with their arguments and status.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	as, err := schema.ListApprovals(r.Context(), s.pool, userFrom(r.Context()).ID, cid, maxApprovalsListed)
	if s.failed(w, r, cid, err) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": as})
}

// approvalDecision is the body of POST .../approvals/{id}.
type approvalDecision struct {
	Approved *bool `json:"approved"`
	// Answer answers an agent's question (an approval of kind question):
	// it must match the question's response_schema, and implies
	// approved.
	Answer json.RawMessage `json:"answer"`
	// ArgumentsSHA256, when given, is the arguments_sha256 the client
	// showed: the decision holds only for those arguments.
	ArgumentsSHA256 string `json:"arguments_sha256"`
}

// maxDecisionBytes bounds the body of a decision: an answer to an agent's
// question is a small JSON document.
const maxDecisionBytes = 64 << 10

// decideApproval records the user's answer and resumes the turn: any
// worker claims it from the announcement committed with the decision.
func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := schema.ValidateID("approval", id); err != nil {
		refuseID(w, err)
		return
	}
	if !strings.HasPrefix(id, "ap_") || len(id) > 64 {
		s.approvalNotFound(w, id)
		return
	}
	var d approvalDecision
	if !decodeJSON(w, r, maxDecisionBytes, false, &d) {
		return
	}
	if len(d.Answer) > 0 && string(d.Answer) != "null" && d.Approved == nil {
		yes := true
		d.Approved = &yes
	}
	if d.Approved == nil {
		writeError(w, http.StatusBadRequest, "bad_json", `field "approved" is required: send {"approved": true} or {"approved": false}, or {"answer": ...} to answer an agent's question`)
		return
	}
	if string(d.Answer) == "null" {
		d.Answer = nil
	}
	if terr := checkJSONText(`"answer"`, d.Answer); terr != nil {
		writeTextError(w, terr)
		return
	}
	user := userFrom(r.Context())
	a, err := s.decide(r.Context(), user.ID, cid, id, schema.Decision{Approved: *d.Approved, Answer: d.Answer, ArgumentsSHA256: d.ArgumentsSHA256, UserID: user.ID})
	switch {
	case errors.Is(err, schema.ErrNotFound) && a.ID == "":
		// The conversation is someone else's or missing (then like any
		// route), or the approval is not the conversation's.
		var check error
		if _, check = schema.GetConversation(r.Context(), s.pool, user.ID, cid); check != nil {
			s.failed(w, r, cid, check)
			return
		}
		s.approvalNotFound(w, id)
		return
	case errors.Is(err, schema.ErrApprovalDecided):
		writeError(w, http.StatusConflict, "approval_decided", "the approval "+strconv.Quote(id)+" was "+a.Status+" already: a call is decided once")
		return
	case errors.Is(err, schema.ErrAnswerInvalid):
		writeError(w, http.StatusUnprocessableEntity, "answer_invalid", err.Error())
		return
	case errors.Is(err, schema.ErrArgumentsChanged):
		writeError(w, http.StatusConflict, "arguments_changed", "the arguments of this call are not the ones shown for approval: reload the approvals and decide on what they show")
		return
	case s.failed(w, r, cid, err):
		return
	}
	if a.Status == schema.ApprovalExpired {
		writeError(w, http.StatusConflict, "approval_expired", "the approval "+strconv.Quote(id)+" waited past its time and the call was denied")
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (s *Server) approvalNotFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, "not_found", "no approval "+strconv.Quote(id)+" in this conversation")
}

// decide records ownerID's decision on an approval of their conversation
// cid and, once it committed, tells the conversation's clients. Its
// errors are schema.DecideApprovalTx's; an approval that expired is
// committed as such, with no error.
func (s *Server) decide(ctx context.Context, ownerID int64, cid, approvalID string, d schema.Decision) (schema.Approval, error) {
	var a schema.Approval
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		a, err = schema.DecideApprovalTx(ctx, tx, ownerID, cid, approvalID, d)
		return err
	})
	if err == nil {
		s.publishApprovalDecided(ctx, a)
	}
	return a, err
}

// publishApprovalDecided tells the conversation's clients that an
// approval was decided (by its user, by its time, or by a stop).
func (s *Server) publishApprovalDecided(ctx context.Context, a schema.Approval) {
	s.publishEvent(ctx, batonnats.ConversationEvent{
		Type: batonnats.EventApprovalDecided, ConversationID: a.ConversationKey, RunID: a.RunID, TurnID: a.TurnID,
		OutboxIDs: a.OutboxIDs, ApprovalID: a.ID, Tool: a.Tool, Decision: a.Status,
	}, "approval-"+a.ID)
}
