package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

type postMessageRequest struct {
	ID      *string `json:"id"`
	Content *string `json:"content"`
	// Files are the message's files, as useChat's file parts (files.go).
	Files []fileIn `json:"files"`
}

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	limit := s.cfg.MaxContentBytes
	var req postMessageRequest
	// JSON escaping can make content up to six times longer in the body
	// (\u00XX); the content's own limit is checked after decoding. The
	// files' room follows their limits.
	if !decodeJSON(w, r, int64(limit)*6+4096+s.cfg.fileRoom(), false, &req) {
		return
	}
	if req.Content == nil && len(req.Files) > 0 {
		req.Content = new(string)
	}
	switch {
	case req.ID == nil:
		writeError(w, http.StatusBadRequest, "bad_id", `"id" is missing: choose a message ID on the client (for example a UUID) and reuse it when you retry`)
		return
	case req.Content == nil:
		writeError(w, http.StatusBadRequest, "bad_content", `"content" is missing`)
		return
	case *req.Content == "" && len(req.Files) == 0:
		writeError(w, http.StatusBadRequest, "bad_content", `"content" is empty`)
		return
	case len(*req.Content) > limit:
		writeError(w, http.StatusRequestEntityTooLarge, "content_too_large",
			fmt.Sprintf("content is %d bytes; the limit is %d bytes", len(*req.Content), limit))
		return
	}
	if err := schema.ValidateID("message", *req.ID); err != nil {
		refuseID(w, err)
		return
	}
	if terr := checkText("content", *req.Content); *req.Content != "" && terr != nil {
		writeTextError(w, terr)
		return
	}
	files, err := decodeFiles(req.Files)
	if fileRefused(w, err) {
		return
	}
	user := userFrom(r.Context())

	// One statement in a transaction of its own: the function stores the
	// message, its files and its outbox row atomically, and a BEGIN and a
	// COMMIT around it would add two round trips to every message's path.
	res, err := schema.InsertMessageTx(r.Context(), s.pool, schema.UserMessage{
		OwnerID: user.ID, ConversationID: cid, MessageID: *req.ID, Content: *req.Content,
		TraceParent: telemetry.TraceParent(r.Context()),
		Files:       files, FileLimits: s.cfg.fileLimits(),
	})
	switch {
	case fileRefused(w, err):
		return
	case errors.Is(err, schema.ErrNotFound):
		s.notFound(w, cid)
		return
	case errors.Is(err, schema.ErrConflict):
		s.metrics.messages.WithLabelValues("conflict").Inc()
		writeError(w, http.StatusConflict, "conflict", err.Error())
		return
	case s.turnRunning(w, err):
		return
	case errors.Is(err, schema.ErrContentTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "content_too_large", err.Error())
		return
	case errors.Is(err, schema.ErrReservedID):
		writeError(w, http.StatusBadRequest, "reserved_id", err.Error())
		return
	case errors.Is(err, schema.ErrBadText):
		writeError(w, http.StatusBadRequest, "bad_text", err.Error())
		return
	case errors.Is(err, schema.ErrInvalid):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	case err != nil:
		s.internalError(w, r, err)
		return
	}
	if err := s.signFiles(r, res.Message.Files); err != nil {
		s.internalError(w, r, err)
		return
	}
	if res.Existed {
		s.metrics.messages.WithLabelValues("retry").Inc()
		writeJSON(w, http.StatusOK, res.Message)
		return
	}
	s.stored(r.Context(), res)
	writeJSON(w, http.StatusAccepted, res.Message)
}

// stored tells what a new message's commit did: the message event, and
// the stop notice of the run it interrupted (double texting interrupt).
func (s *Server) stored(ctx context.Context, res schema.InsertResult) {
	s.metrics.messages.WithLabelValues("stored").Inc()
	s.notifyStop(res.ConversationKey, res.InterruptedRunID)
	// The event carries the message id its owner knows; the subject and
	// the deduplication id carry the server's keys.
	s.publishEvent(ctx, batonnats.ConversationEvent{
		Type: batonnats.EventMessage, ConversationID: res.ConversationKey, MessageID: res.Message.ID, OutboxIDs: []int64{res.OutboxID},
	}, "message-"+res.MessageKey)
}

// notifyStop tells the worker that runs runID that its run was asked to
// stop (a stop, or an interrupting message), once that committed. A
// notice lost is a stop that takes effect at the run's next lease renewal
// instead.
func (s *Server) notifyStop(conversationKey, runID string) {
	if runID == "" || s.nc == nil {
		return
	}
	if err := s.nc.Publish(batonnats.StopSubject(conversationKey, runID), nil); err != nil {
		s.log.Warn().Err(err).Msg("could not publish a stop notice; the run stops at its next lease renewal")
	}
}

// turnRunning answers 409 turn_running to a message that the
// conversation's double texting (reject) refused while a turn runs or
// waits, with the producer's message, which says what to do; it reports
// whether err was that.
func (s *Server) turnRunning(w http.ResponseWriter, err error) bool {
	var pe *schema.ProducerError
	if !errors.As(err, &pe) || pe.Code != schema.SQLStateTurnRunning {
		return false
	}
	s.metrics.messages.WithLabelValues("turn_running").Inc()
	writeError(w, http.StatusConflict, "turn_running", pe.Message)
	return true
}

// listMessages returns a page of a conversation's messages, oldest first:
// ?after=<cursor> continues after the previous page (its "next_after", an
// opaque cursor of the conversation's), ?limit=<n> sets the page size.
func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := schema.DefaultMessagePage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > schema.MaxMessagePage {
			writeError(w, http.StatusBadRequest, "bad_limit", fmt.Sprintf("limit must be a number from 1 to %d", schema.MaxMessagePage))
			return
		}
		limit = n
	}
	msgs, next, err := schema.ListMessages(r.Context(), s.pool, userFrom(r.Context()).ID, cid, q.Get("after"), limit)
	if errors.Is(err, schema.ErrBadCursor) {
		writeError(w, http.StatusBadRequest, "bad_cursor", `after must be the "next_after" of a page of this conversation`)
		return
	}
	if s.failed(w, r, cid, err) {
		return
	}
	for i := range msgs {
		if err := s.signFiles(r, msgs[i].Files); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	body := map[string]any{}
	if next != "" {
		body["next_after"] = next
	}
	body["messages"] = msgs
	writeJSON(w, http.StatusOK, body)
}
