package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// The AI SDK adapter: useChat's default transport speaks to these routes
// unchanged. A chat is a conversation (its id the conversation's), a
// request's new message is written through the producer like any other,
// and the answer is the reply of the turn that answers it, read from the
// same conversation events and live deltas as the events endpoint.

// postChat takes a useChat request: it stores the new message (creating
// the chat on first use) or, for "regenerate-message", puts the newest
// turn back to be answered again, before any byte of the answer; then it
// streams the reply that answers it.
func (s *Server) postChat(w http.ResponseWriter, r *http.Request) {
	user := userFrom(r.Context())
	// The body's limit follows the files' limits: room for one message's
	// files at their limits beside the history's.
	r.Body = http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxChatBodyBytes)+s.cfg.fileRoom())
	req, err := readChatRequest(newTextReader(r.Body), s.cfg.MaxChatMessages)
	if err != nil {
		s.refuseChatBody(w, r, err)
		return
	}
	if !checkChatRequest(w, &req) {
		return
	}
	if req.Last != nil && req.Last.Role == "assistant" && req.Trigger == triggerSubmit {
		s.answerApprovals(w, r, req)
		return
	}
	messageID, content, files, err := req.newMessage(s.cfg.MaxContentBytes)
	if err != nil {
		s.refuseChatBody(w, r, err)
		return
	}
	if err := schema.ValidateID("message", messageID); err != nil {
		refuseID(w, fmt.Errorf("the new message's id: %w", err))
		return
	}
	if !s.chatsLive(w) {
		return
	}
	release, err := s.acquireStream(user.ID)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	defer release()

	ctx := r.Context()
	// The chat's key first (a new chat is made here), so that the stream
	// listens before the write: every event of the turn that answers it
	// then reaches the stream, and only a message stored before needs the
	// database's word on where its turn stands.
	title := content
	if strings.TrimSpace(title) == "" && len(files) > 0 {
		title = files[0].Filename
	}
	c, created, err := s.chatKey(ctx, user.ID, req.ChatID, title, req.Trigger == triggerSubmit)
	if err != nil {
		s.refuseChat(w, r, req.ChatID, err)
		return
	}
	f := s.subscribe(c.Key)
	defer f.unsubscribe()
	var row int64
	var existed bool
	if req.Trigger == triggerRegenerate {
		row, err = s.regenerate(ctx, user.ID, req.ChatID, messageID, req.MessageID, req.RepeatWrites)
	} else {
		row, existed, err = s.submit(ctx, user.ID, req.ChatID, messageID, content, files)
	}
	if err != nil {
		if created {
			// The chat was made for this message: it goes with it.
			if _, derr := schema.DeleteEmptyConversation(context.WithoutCancel(ctx), s.pool, user.ID, req.ChatID); derr != nil {
				s.log.Warn().Err(derr).Msg("remove a chat created for a refused message")
			}
		}
		s.refuseChat(w, r, req.ChatID, err)
		return
	}
	// A message that waits behind a turn stopped at an approval says so
	// at once, with the approval's request, as a reload does: nothing
	// else happens until its user decides (or it expires). One that
	// came to a chat whose turn stops there later hears it from that
	// turn's event (chatStream.event).
	check := existed || c.TurnState == schema.TurnWaitingForApproval
	s.streamReply(w, r, f, row, check, nil)
}

// checkChatRequest answers 400 to a request whose chat id or trigger
// Baton does not take; a request without a trigger submits.
func checkChatRequest(w http.ResponseWriter, req *chatRequest) bool {
	if err := schema.ValidateID("chat", req.ChatID); err != nil {
		refuseID(w, fmt.Errorf(`"id": %w`, err))
		return false
	}
	if req.Trigger == "" {
		req.Trigger = triggerSubmit
	}
	if req.Trigger != triggerSubmit && req.Trigger != triggerRegenerate {
		writeError(w, http.StatusBadRequest, "bad_trigger", fmt.Sprintf(`"trigger" is %q: send %q or %q`, req.Trigger, triggerSubmit, triggerRegenerate))
		return false
	}
	return true
}

// chatKey returns the user's chat, creating it on first use (with
// create) within the user's quota, in a transaction of its own.
//
// A new chat commits before its first message: a worker's claim finds a
// conversation by its row, which the message's transaction locks until
// its commit is visible (see schema.ClaimTx); a conversation created in
// that same transaction has no row to wait on yet, and a claim that came
// early would take it for deleted.
func (s *Server) chatKey(ctx context.Context, owner int64, chatID, content string, create bool) (c schema.Conversation, created bool, err error) {
	// Most requests are to a chat that exists: one round trip.
	if c, err := schema.GetConversation(ctx, s.pool, owner, chatID); err == nil || !errors.Is(err, schema.ErrNotFound) || !create {
		return c, false, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		c, err = schema.GetConversation(ctx, tx, owner, chatID)
		if err == nil || !errors.Is(err, schema.ErrNotFound) || !create {
			return err
		}
		if err := schema.CheckConversationQuotaTx(ctx, tx, owner, s.cfg.Quotas.MaxConversations); err != nil {
			return err
		}
		c, created, err = schema.CreateConversationWith(ctx, tx, owner, schema.NewConversation{ID: chatID, Title: chatTitle(content), DoubleTexting: s.cfg.DoubleTexting})
		return err
	})
	return c, created, err
}

// submit stores the new message in the user's chat and returns its outbox
// row. A message stored before (the same POST again) is not stored twice:
// existed is set, and its turn is followed.
func (s *Server) submit(ctx context.Context, owner int64, chatID, messageID, content string, files []schema.FileIn) (row int64, existed bool, err error) {
	// One statement in a transaction of its own (see postMessage).
	res, err := schema.InsertMessageTx(ctx, s.pool, schema.UserMessage{
		OwnerID: owner, ConversationID: chatID, MessageID: messageID, Content: content,
		TraceParent: telemetry.TraceParent(ctx),
		Files:       files, FileLimits: s.cfg.fileLimits(),
	})
	if err != nil {
		return 0, false, err
	}
	if res.Existed {
		s.metrics.messages.WithLabelValues("retry").Inc()
	} else {
		s.stored(ctx, res)
	}
	if res.OutboxID == 0 {
		return 0, true, errNoTurn
	}
	return res.OutboxID, res.Existed, nil
}

// errNoTurn: the message was stored so long ago that its outbox row was
// pruned; there is no turn to follow.
var errNoTurn = errors.New("the message's turn is too old to follow")

// regenerate puts the newest turn of the chat, the one that answered
// messageID, back to be answered again, and returns the turn's oldest row.
func (s *Server) regenerate(ctx context.Context, owner int64, chatID, messageID, replyID string, repeatWrites bool) (int64, error) {
	var out schema.Regenerated
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = schema.RegenerateTx(ctx, tx, schema.Regenerate{
			OwnerID: owner, ConversationID: chatID, MessageID: messageID, ReplyID: replyID,
			MaxPerHour: s.cfg.Quotas.MaxRetriesPerHour, RepeatWrites: repeatWrites,
		})
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, out.OutboxIDs)
	})
	if err != nil {
		return 0, err
	}
	s.publishEvent(ctx, batonnats.ConversationEvent{Type: batonnats.EventPending, ConversationID: out.ConversationKey, OutboxIDs: out.OutboxIDs}, "")
	return out.OutboxIDs[0], nil
}

// answerApprovals takes useChat's answers to approvals: addToolApprovalResponse
// marks the reply's tool part "approval-responded", and the next request
// carries that reply as its last message. Each answer is recorded as POST
// /v1/conversations/{cid}/approvals/{id} records it, all in one
// transaction (one refused, none is), and the answer to the request is
// the rest of the same reply, from the turn the decision resumes. The
// same answer again (a request sent twice) follows that turn.
func (s *Server) answerApprovals(w http.ResponseWriter, r *http.Request, req chatRequest) {
	responses, shown, err := req.approvalResponses()
	if err != nil {
		s.refuseChatBody(w, r, err)
		return
	}
	ctx := r.Context()
	user := userFrom(ctx)
	c, release, ok := s.streamChat(w, r, req.ChatID)
	if !ok {
		return
	}
	defer release()
	f := s.subscribe(c.Key)
	defer f.unsubscribe()
	var decided []schema.Approval
	var refused func()
	var row int64
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		decided, row, refused, err = s.decideApprovals(ctx, tx, w, user.ID, req.ChatID, responses)
		return err
	})
	switch {
	case errors.Is(err, errRefused):
		refused()
		return
	case err != nil:
		s.internalError(w, r, err)
		return
	}
	for _, a := range decided {
		s.publishApprovalDecided(ctx, a)
	}
	s.streamReply(w, r, f, row, true, shown)
}

// decideApprovals records each answer as its approval's decision, in tx,
// and returns the approvals decided now and the oldest row of their
// turns. When an answer is refused, the error is errRefused and refused
// answers the request.
func (s *Server) decideApprovals(ctx context.Context, tx pgx.Tx, w http.ResponseWriter, userID int64, chatID string, responses []approvalResponse) (decided []schema.Approval, row int64, refused func(), err error) {
	for _, resp := range responses {
		id := resp.ApprovalID
		if !strings.HasPrefix(id, "ap_") || len(id) > 64 {
			return nil, 0, func() { s.approvalNotFound(w, id) }, errRefused
		}
		a, err := schema.DecideApprovalTx(ctx, tx, userID, chatID, id, schema.Decision{Approved: resp.Approved, UserID: userID})
		want := schema.ApprovalDenied
		if resp.Approved {
			want = schema.ApprovalApproved
		}
		switch {
		case errors.Is(err, schema.ErrNotFound):
			return nil, 0, func() { s.approvalNotFound(w, id) }, errRefused
		case (err == nil || errors.Is(err, schema.ErrApprovalDecided)) && a.Status == schema.ApprovalExpired:
			// Past its time: the call was denied, as through the REST
			// route. The expiry commits on its own (this transaction
			// is refused whole).
			expiredNow := err == nil
			return nil, 0, func() {
				if expiredNow {
					_, _ = s.decide(context.WithoutCancel(ctx), userID, chatID, id, schema.Decision{Approved: resp.Approved, UserID: userID})
				}
				writeError(w, http.StatusConflict, "approval_expired", "the approval "+strconv.Quote(id)+" waited past its time and the call was denied")
			}, errRefused
		case errors.Is(err, schema.ErrApprovalDecided) && a.Status != want:
			return nil, 0, func() {
				writeError(w, http.StatusConflict, "approval_decided", "the approval "+strconv.Quote(id)+" was "+a.Status+" already: a call is decided once")
			}, errRefused
		case errors.Is(err, schema.ErrApprovalDecided):
			// Decided so already: the same answer again.
		case errors.Is(err, schema.ErrArgumentsChanged):
			return nil, 0, func() {
				writeError(w, http.StatusConflict, "arguments_changed", "the arguments of this call are not the ones shown for approval: reload the chat")
			}, errRefused
		case err != nil:
			return nil, 0, nil, err
		default:
			decided = append(decided, a)
		}
		if len(a.OutboxIDs) == 0 {
			return nil, 0, nil, fmt.Errorf("approval %s has no rows", id)
		}
		if first := slices.Min(a.OutboxIDs); row == 0 || first < row {
			row = first
		}
	}
	return decided, row, nil, nil
}

// errRefused ends a transaction whose request is refused with an answer
// of its own.
var errRefused = errors.New("refused")

// chatTitle is a new chat's title: the start of its first message.
func chatTitle(content string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(content), "\n")
	if utf8.RuneCountInString(line) > 80 {
		line = string([]rune(line)[:80]) + "…"
	}
	return line
}

// chatsLive checks that the process follows the conversation events, which
// a chat's answer is read from, and answers 503 when it does not.
func (s *Server) chatsLive(w http.ResponseWriter) bool {
	if s.hub == nil {
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "chats need NATS: start the API with --nats-url / BATON_NATS_URL")
		return false
	}
	if err := s.hub.start(); err != nil {
		s.log.Warn().Err(err).Msg("cannot follow the events stream")
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, "no_live_events", "live events are not available right now; try again shortly")
		return false
	}
	return true
}

// streamReply answers with the UI message stream of the reply that answers
// the outbox row of f's conversation (f subscribed before the row could
// change); with check, it reads the row's state first, for what came
// before f subscribed. shown are the parts of the reply that the client
// has already.
func (s *Server) streamReply(w http.ResponseWriter, r *http.Request, f *follower, row int64, check bool, shown []batonnats.LivePart) {
	out := newUIStream(newSSEWriter(streamResponse(w, s.cfg.WriteTimeout)))
	out.seed(shown)
	f.follow(r.Context(), newChatStream(s, f.key, row, out, check))
}

// streamResponse lifts a request's deadlines for a long answer: each write
// gets the write timeout instead.
func streamResponse(w http.ResponseWriter, timeout time.Duration) http.ResponseWriter {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	return &streamWriter{ResponseWriter: w, rc: rc, timeout: timeout}
}

// refuseChatBody answers a chat request whose body Baton does not take.
func (s *Server) refuseChatBody(w http.ResponseWriter, r *http.Request, err error) {
	var ce *chatBodyError
	var mbe *http.MaxBytesError
	var bte *bodyTimeoutError
	var te *textError
	switch {
	case fileRefused(w, err):
	case errors.As(err, &ce):
		writeError(w, ce.status, ce.code, ce.message)
	case errors.As(err, &te):
		writeTextError(w, te)
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the request body is over %d bytes (--max-chat-body-bytes)", mbe.Limit))
	case errors.As(err, &bte):
		writeError(w, http.StatusRequestTimeout, "request_timeout", bte.Error())
	default:
		s.internalError(w, r, err)
	}
}

// refuseChat answers a chat request that its write refused.
func (s *Server) refuseChat(w http.ResponseWriter, r *http.Request, chatID string, err error) {
	switch {
	case quotaExceeded(w, err), turnMadeWrites(w, err), fileRefused(w, err):
	case errors.Is(err, schema.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "no chat "+strconv.Quote(chatID)+" with that message for this user")
	case errors.Is(err, schema.ErrConflict):
		s.metrics.messages.WithLabelValues("conflict").Inc()
		writeError(w, http.StatusConflict, "conflict", err.Error()+" (editing a sent message is not supported)")
	case s.turnRunning(w, err):
	case errors.Is(err, schema.ErrReservedID):
		writeError(w, http.StatusBadRequest, "reserved_id", err.Error())
	case errors.Is(err, schema.ErrBadText):
		writeError(w, http.StatusBadRequest, "bad_text", err.Error())
	case errors.Is(err, schema.ErrTurnRunning):
		writeError(w, http.StatusConflict, "turn_running", "a turn of this chat is running or waiting: stop it, or wait for its reply, before regenerating")
	case errors.Is(err, schema.ErrNotNewest):
		writeError(w, http.StatusConflict, "not_newest", err.Error()+": only the newest reply can be regenerated")
	case errors.Is(err, errNoTurn):
		writeError(w, http.StatusGone, "turn_gone", "this message was answered long ago; its turn is no longer kept")
	default:
		s.internalError(w, r, err)
	}
}

// resumeChat is useChat's reconnect (resume: true): 204 when no turn of the
// chat runs or waits; otherwise the current reply from its start (the
// worker's snapshot of it, then live chunks to its end), from any API
// process.
func (s *Server) resumeChat(w http.ResponseWriter, r *http.Request) {
	chatID := r.PathValue("id")
	if err := schema.ValidateID("chat", chatID); err != nil {
		writeError(w, http.StatusBadRequest, "bad_id", err.Error())
		return
	}
	c, release, ok := s.streamChat(w, r, chatID)
	if !ok {
		return
	}
	defer release()
	row, ok, err := schema.ActiveRow(r.Context(), s.pool, c.Key)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if !ok {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	f := s.subscribe(c.Key)
	defer f.unsubscribe()
	s.streamReply(w, r, f, row, true, nil)
}

// stopConversation stops a conversation's turn: the stop commits, then the
// worker that runs the turn is told, and ends it within a moment with what
// it wrote, marked stopped. Messages that waited for a turn are settled at
// once, and their streams end.
func (s *Server) stopConversation(w http.ResponseWriter, r *http.Request) {
	cid, ok := conversationID(w, r)
	if !ok {
		return
	}
	var st schema.Stop
	err := pgx.BeginFunc(r.Context(), s.pool, func(tx pgx.Tx) error {
		var err error
		st, err = schema.StopTx(r.Context(), tx, userFrom(r.Context()).ID, cid)
		return err
	})
	if s.failed(w, r, cid, err) {
		return
	}
	s.notifyStop(st.ConversationKey, st.RunID)
	if st.Denied {
		s.publishApprovalDecided(r.Context(), *st.Approval)
	}
	if len(st.SettledIDs) > 0 {
		s.publishEvent(r.Context(), batonnats.ConversationEvent{Type: batonnats.EventStopped, ConversationID: st.ConversationKey, OutboxIDs: st.SettledIDs}, "")
	}
	// A turn that waited for an approval is stopped too: its approval is
	// denied and its messages settled.
	writeJSON(w, http.StatusOK, map[string]any{"stopped": st.RunID != "" || st.Approval != nil, "settled": len(st.SettledIDs)})
}

// streamChat finds the user's chat and takes one of the user's open
// streams for an answer that streams it. It has answered the request
// (404, 503 or 429) when ok is false; otherwise release gives the stream
// back.
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, chatID string) (c schema.Conversation, release func(), ok bool) {
	user := userFrom(r.Context())
	c, err := schema.GetConversation(r.Context(), s.pool, user.ID, chatID)
	if errors.Is(err, schema.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no chat "+strconv.Quote(chatID)+" for this user")
		return c, nil, false
	}
	if err != nil {
		s.internalError(w, r, err)
		return c, nil, false
	}
	if !s.chatsLive(w) {
		return c, nil, false
	}
	release, err = s.acquireStream(user.ID)
	if err != nil {
		s.refuse(w, r, err)
		return c, nil, false
	}
	return c, release, true
}
