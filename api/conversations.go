package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

type createConversationRequest struct {
	ID    *string `json:"id"`
	Title string  `json:"title"`
	// DoubleTexting is the conversation's policy; the server's
	// (--double-texting) when absent.
	DoubleTexting *string `json:"double_texting"`
}

func (s *Server) createConversation(w http.ResponseWriter, r *http.Request) {
	var req createConversationRequest
	if !decodeJSON(w, r, 16<<10, true, &req) {
		return
	}
	id := uuid.NewString()
	if req.ID != nil {
		id = *req.ID
	}
	if err := schema.ValidateID("conversation", id); err != nil {
		refuseID(w, err)
		return
	}
	if terr := checkText("title", req.Title); terr != nil {
		writeTextError(w, terr)
		return
	}
	if n := utf8.RuneCountInString(req.Title); n > schema.MaxTitleLength {
		writeError(w, http.StatusBadRequest, "bad_title", "title must be at most "+strconv.Itoa(schema.MaxTitleLength)+" characters")
		return
	}
	policy := s.cfg.DoubleTexting
	if req.DoubleTexting != nil {
		var ok bool
		if policy, ok = doubleTexting(w, *req.DoubleTexting); !ok {
			return
		}
	}
	owner := userFrom(r.Context()).ID
	var c schema.Conversation
	var created bool
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		var err error
		if c, err = schema.GetConversation(r.Context(), tx, owner, id); err == nil {
			// Already the user's: creating it again changes nothing and
			// counts against no quota.
			return nil
		}
		if err := schema.CheckConversationQuotaTx(r.Context(), tx, owner, s.cfg.Quotas.MaxConversations); err != nil {
			return err
		}
		c, created, err = schema.CreateConversationWith(r.Context(), tx, owner, schema.NewConversation{ID: id, Title: req.Title, DoubleTexting: policy})
		return err
	})
	if quotaExceeded(w, err) {
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, c)
}

func (s *Server) listConversations(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "bad_limit", "limit must be a number from 1 to 1000")
			return
		}
		limit = n
	}
	cs, err := schema.ListConversations(r.Context(), s.pool, userFrom(r.Context()).ID, limit)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"conversations": cs})
}

// conversationID reads and validates {cid}; it writes the error itself.
func conversationID(w http.ResponseWriter, r *http.Request) (string, bool) {
	cid := r.PathValue("cid")
	if err := schema.ValidateID("conversation", cid); err != nil {
		refuseID(w, err)
		return "", false
	}
	return cid, true
}

// refuseID answers a request whose id breaks the rules of
// schema.ValidateID: 400 bad_id, or reserved_id for a message id that
// takes a prefix of the server's own messages.
func refuseID(w http.ResponseWriter, err error) {
	code := "bad_id"
	if errors.Is(err, schema.ErrReservedID) {
		code = "reserved_id"
	}
	writeError(w, http.StatusBadRequest, code, err.Error())
}

func (s *Server) notFound(w http.ResponseWriter, cid string) {
	writeError(w, http.StatusNotFound, "not_found", "no conversation "+strconv.Quote(cid)+" for this user")
}

// failed writes the response for a failed conversation operation: 404 for
// an unknown or someone else's conversation, 500 otherwise. It reports
// whether err was an error.
func (s *Server) failed(w http.ResponseWriter, r *http.Request, cid string, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, schema.ErrNotFound):
		s.notFound(w, cid)
	default:
		s.internalError(w, r, err)
	}
	return true
}

func (s *Server) getConversation(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	c, err := schema.GetConversation(r.Context(), s.pool, userFrom(r.Context()).ID, cid)
	if s.failed(w, r, cid, err) {
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// doubleTexting reads a policy a client gave; it answers 400, naming the
// policies, when it is none.
func doubleTexting(w http.ResponseWriter, v string) (schema.DoubleTexting, bool) {
	p, err := schema.ParseDoubleTexting(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_double_texting", `"double_texting": `+err.Error())
		return "", false
	}
	return p, true
}

type patchConversationRequest struct {
	DoubleTexting *string `json:"double_texting"`
}

// patchConversation changes what a conversation's owner may change of it:
// its double texting, for the messages sent after it.
func (s *Server) patchConversation(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	var req patchConversationRequest
	if !decodeJSON(w, r, 16<<10, false, &req) {
		return
	}
	if req.DoubleTexting == nil {
		writeError(w, http.StatusBadRequest, "bad_body", `nothing to change: send {"double_texting": "`+string(s.cfg.DoubleTexting)+`"}, one of `+schema.DoubleTextingNames())
		return
	}
	policy, ok := doubleTexting(w, *req.DoubleTexting)
	if !ok {
		return
	}
	c, err := schema.SetDoubleTexting(r.Context(), s.pool, userFrom(r.Context()).ID, cid, policy)
	if s.failed(w, r, cid, err) {
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) deleteConversation(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	key, err := schema.DeleteConversation(r.Context(), s.pool, userFrom(r.Context()).ID, cid)
	if s.failed(w, r, cid, err) {
		return
	}
	// Open event streams of the conversation end on this event.
	s.publishEvent(r.Context(), batonnats.ConversationEvent{Type: batonnats.EventDeleted, ConversationID: key}, "deleted-"+key)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) markRead(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	err := schema.MarkRead(r.Context(), s.pool, userFrom(r.Context()).ID, cid)
	if s.failed(w, r, cid, err) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// repeatRequest is the body of a retry: whether a turn that made writes
// may make them again.
type repeatRequest struct {
	RepeatWrites bool `json:"repeat_writes"`
}

// retryFailed gives a conversation's failed turn another round of
// attempts. The server resets its own queue state; the client only asks.
// A turn that made writes is retried only when the body says
// {"repeat_writes": true}.
func (s *Server) retryFailed(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	var req repeatRequest
	if !decodeJSON(w, r, 4096, true, &req) {
		return
	}
	var res schema.RetryResult
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		var err error
		res, err = schema.RetryFailedTx(r.Context(), tx, schema.Retry{OwnerID: userFrom(r.Context()).ID, ConversationID: cid,
			MaxPerHour: s.cfg.Quotas.MaxRetriesPerHour, RepeatWrites: req.RepeatWrites})
		if err != nil || len(res.OutboxIDs) == 0 {
			return err
		}
		// A user's retry is labelled with the time, so a second retry
		// within the duplicate window is not swallowed.
		return schema.AnnounceTx(r.Context(), tx, batonnats.ReasonUserRetry, res.OutboxIDs)
	})
	if quotaExceeded(w, err) || turnMadeWrites(w, err) || s.failed(w, r, cid, err) {
		return
	}
	if len(res.OutboxIDs) > 0 {
		s.publishEvent(r.Context(), batonnats.ConversationEvent{Type: batonnats.EventPending, ConversationID: res.ConversationKey, OutboxIDs: res.OutboxIDs}, "")
	}
	writeJSON(w, http.StatusOK, map[string]any{"retried": len(res.OutboxIDs)})
}

// turnMadeWrites answers 409 turn_made_writes, naming the writes, when err
// says that the turn to answer again made writes; it reports whether it
// did.
func turnMadeWrites(w http.ResponseWriter, err error) bool {
	var we *schema.WritesError
	if !errors.As(err, &we) {
		return false
	}
	writeError(w, http.StatusConflict, "turn_made_writes",
		fmt.Sprintf("the turn made writes (%s): answering it again would run them again; send {\"repeat_writes\": true} to do that",
			strings.Join(we.Tools, ", ")))
	return true
}
