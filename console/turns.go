package console

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// turnsView is the page of failed and stuck turns.
type turnsView struct {
	Failed []schema.FailedTurn
	// Next is the address of the next page of failed turns.
	Next  template.URL
	Stuck []schema.StuckTurn
	// The settings that make a turn stuck, as the page says them.
	LeaseGrace, PendingAfter, ApprovalAfter time.Duration
}

func (s *Server) turnsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after *schema.FailedCursor
	if at := q.Get("after_at"); at != "" {
		t, err1 := time.Parse(time.RFC3339Nano, at)
		id, err2 := strconv.ParseInt(q.Get("after"), 10, 64)
		if err1 != nil || err2 != nil {
			s.errorPage(w, r, http.StatusBadRequest, "The page's cursor is not valid: start again from the first page.")
			return
		}
		after = &schema.FailedCursor{At: t, ID: id}
	}
	v := turnsView{LeaseGrace: s.cfg.LeaseGrace, PendingAfter: s.cfg.PendingAfter, ApprovalAfter: s.cfg.ApprovalAfter}
	failed, next, err := schema.FailedTurns(r.Context(), s.db, after, s.cfg.PageSize)
	if err != nil {
		s.failed(w, r, err)
		return
	}
	v.Failed = failed
	if next != nil {
		v.Next = template.URL("/turns?after_at=" + urlQueryEscape(next.At.Format(time.RFC3339Nano)) + "&after=" + strconv.FormatInt(next.ID, 10))
	}
	if after == nil {
		v.Stuck, err = schema.StuckTurns(r.Context(), s.db, schema.StuckOptions{
			LeaseGrace: s.cfg.LeaseGrace, PendingAfter: s.cfg.PendingAfter, ApprovalAfter: s.cfg.ApprovalAfter, Limit: s.cfg.PageSize,
		})
		if err != nil {
			s.failed(w, r, err)
			return
		}
	}
	if s.cfg.HideContent {
		for i := range v.Failed {
			for j := range v.Failed[i].Writes {
				o := &v.Failed[i].Writes[j]
				o.Arguments, o.Result = hidden(o.Arguments), hidden(o.Result)
			}
		}
	}
	s.render(w, r, http.StatusOK, "turns", s.newView(r, "Failed and stuck turns", "turns", v))
}

// retryTurn retries the conversation's failed turn. A turn whose unknown
// write an operator recorded goes on from its journal (ResumeTurnTx), so
// that the call is never sent again; any other takes the user's own path
// (RetryFailedTx, the API's Retry), which starts the turn's steps over.
// A turn with a write whose outcome is still unknown is refused until its
// outcome is recorded.
func (s *Server) retryTurn(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	back := "/conversations/" + pathEscape(key)
	if r.PostForm.Get("back") == "turns" {
		back = "/turns"
	}
	failed, err := schema.FailedTurnOf(r.Context(), s.db, key)
	if errors.Is(err, schema.ErrNotFound) {
		redirect(w, r, back, "nothing-to-retry")
		return
	}
	if err != nil {
		s.failed(w, r, err)
		return
	}
	if unknown := failed.UnknownWrites(); len(unknown) > 0 {
		s.errorPage(w, r, http.StatusConflict, fmt.Sprintf(
			"The turn sent %s and its outcome is unknown: it may have taken effect. Record what became of it on the conversation's page first; the turn then goes on from its journal without sending it again.",
			describeCalls(unknown)))
		return
	}
	op := operator(r)
	resume := failed.Journaled && failed.OutcomeRecorded()
	var ids []int64
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		var err error
		var action, detail string
		if resume {
			var res schema.ResumeResult
			res, err = schema.ResumeTurnTx(r.Context(), tx, key)
			ids, action, detail = res.OutboxIDs, schema.ActionResumeTurn, "goes on from the journal of turn "+res.TurnID
		} else {
			var res schema.RetryResult
			// The operator's retry is the user's own, uncounted against
			// the user's quota of retries.
			// A turn that made writes starts over only when the operator
			// says to repeat them, as the user's retry does.
			res, err = schema.RetryFailedTx(r.Context(), tx, schema.Retry{
				OwnerID: failed.Conversation.OwnerID, ConversationID: failed.Conversation.PublicID,
				RepeatWrites: r.PostForm.Get("repeat_writes") == "1",
			})
			ids, action, detail = res.OutboxIDs, schema.ActionRetryTurn, "the user's retry: the turn starts over"
		}
		if err != nil || len(ids) == 0 {
			return err
		}
		if err := schema.AnnounceTx(r.Context(), tx, batonnats.ReasonUserRetry, ids); err != nil {
			return err
		}
		return schema.RecordOperatorActionTx(r.Context(), tx, op, action, key,
			fmt.Sprintf("%s; run %s; %d message(s)", detail, failed.RunID, len(ids)))
	})
	var writes *schema.WritesError
	switch {
	case errors.Is(err, schema.ErrConversationBusy):
		s.errorPage(w, r, http.StatusConflict, "A run holds the conversation now: wait for its turn to end.")
		return
	case errors.As(err, &writes):
		s.errorPage(w, r, http.StatusConflict, fmt.Sprintf(
			"The turn made writes (%s): a retry starts it over and would make them again. To retry all the same, tick \"and repeat its writes\" beside Retry.",
			strings.Join(writes.Tools, ", ")))
		return
	case errors.Is(err, schema.ErrOutcomeUnknown):
		s.errorPage(w, r, http.StatusConflict, "A write of the turn has no known outcome: record what became of it first.")
		return
	case err != nil:
		s.failed(w, r, err)
		return
	}
	if len(ids) == 0 {
		redirect(w, r, back, "nothing-to-retry")
		return
	}
	s.log.Info().Str("operator", op.Name).Str("conversation", key).Bool("from_journal", resume).Msg("operator retried a failed turn")
	if resume {
		redirect(w, r, back, "resumed")
		return
	}
	redirect(w, r, back, "retried")
}

func describeCalls(ops []schema.OperationRow) string {
	var parts []string
	for _, o := range ops {
		parts = append(parts, fmt.Sprintf("%s (call %s)", o.Tool, o.ToolCallID))
	}
	return strings.Join(parts, ", ")
}

// maxResultBytes bounds the result an operator records for a call.
const maxResultBytes = 32 << 10

// recordOutcome records what became of a write whose outcome was unknown:
// "done", with the result the agent will read, or "not_done".
func (s *Server) recordOutcome(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.errorPage(w, r, http.StatusNotFound, "No such call.")
		return
	}
	var done bool
	switch r.PostForm.Get("outcome") {
	case "done":
		done = true
	case "not_done":
	default:
		s.errorPage(w, r, http.StatusBadRequest, `Say what became of the call: "it was done" or "it was not done".`)
		return
	}
	result := r.PostForm.Get("result")
	if done && strings.TrimSpace(result) == "" {
		s.errorPage(w, r, http.StatusBadRequest, "Give the call's result: the agent reads it as the call's answer.")
		return
	}
	if len(result) > maxResultBytes {
		s.errorPage(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("The result is over %d bytes.", maxResultBytes))
		return
	}
	op := operator(r)
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		o, err := schema.RecordOutcomeTx(r.Context(), tx, schema.Outcome{ConversationKey: key, OperationID: id, Done: done, Result: result, Operator: op.Name})
		if err != nil {
			return err
		}
		what := "it was not done"
		if done {
			what = "it was done"
		}
		return schema.RecordOperatorActionTx(r.Context(), tx, op, schema.ActionRecordOutcome, key,
			fmt.Sprintf("operation %d, %s (call %s): %s", o.ID, o.Tool, o.ToolCallID, what))
	})
	switch {
	case errors.Is(err, schema.ErrNotFound):
		s.errorPage(w, r, http.StatusNotFound, "The conversation has no such call.")
		return
	case errors.Is(err, schema.ErrOutcomeKnown):
		s.errorPage(w, r, http.StatusConflict, "The call's outcome is known already: there is nothing to record.")
		return
	case errors.Is(err, schema.ErrConversationBusy):
		s.errorPage(w, r, http.StatusConflict, "A run holds the conversation now: wait for its turn to end.")
		return
	case err != nil:
		s.failed(w, r, err)
		return
	}
	s.log.Info().Str("operator", op.Name).Str("conversation", key).Int64("operation", id).Bool("done", done).Msg("operator recorded an outcome")
	redirect(w, r, "/conversations/"+pathEscape(key), "outcome")
}
