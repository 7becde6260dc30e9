package console

import (
	"encoding/json"
	"errors"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/schema"
)

// conversationsView is the search page: a user's conversations, or those
// with an id.
type conversationsView struct {
	User, ID      string
	Conversations []schema.ConversationRow
	// Next is the address of the next page; empty on the last.
	Next template.URL
}

// conversationsPage finds conversations by their user (a page at a time,
// by their last update) or by id (the server's key or the client's).
func (s *Server) conversationsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := conversationsView{User: strings.TrimSpace(q.Get("user")), ID: strings.TrimSpace(q.Get("id"))}
	var err error
	switch {
	case v.ID != "":
		v.Conversations, err = schema.ConversationsByID(r.Context(), s.db, v.ID, s.cfg.PageSize)
	case v.User != "":
		var after *schema.ConversationCursor
		if at, key := q.Get("after_at"), q.Get("after"); at != "" {
			t, perr := time.Parse(time.RFC3339Nano, at)
			if perr != nil {
				s.errorPage(w, r, http.StatusBadRequest, "The page's cursor is not valid: start again from the first page.")
				return
			}
			after = &schema.ConversationCursor{UpdatedAt: t, Key: key}
		}
		v.Conversations, err = schema.ConversationsOfUser(r.Context(), s.db, v.User, after, s.cfg.PageSize+1)
		if len(v.Conversations) > s.cfg.PageSize {
			v.Conversations = v.Conversations[:s.cfg.PageSize]
			last := v.Conversations[len(v.Conversations)-1]
			v.Next = template.URL("/conversations?user=" + urlQueryEscape(v.User) + "&after_at=" + urlQueryEscape(last.UpdatedAt.Format(time.RFC3339Nano)) + "&after=" + urlQueryEscape(last.Key))
		}
	}
	if err != nil {
		s.failed(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "conversations", s.newView(r, "Conversations", "conversations", v))
}

// conversationView is one conversation's page.
type conversationView struct {
	schema.ConversationRecord
	// Failed is the conversation's failed turn, if it has one.
	Failed *schema.FailedTurn
	// Older is the address of older messages; empty at the first.
	Older template.URL
	// Paged: the page shows older messages, and does not refresh.
	Paged bool
}

// readConversation reads what a conversation's page shows, with its
// content left out under HideContent.
func (s *Server) readConversation(r *http.Request) (conversationView, error) {
	key := r.PathValue("key")
	var before int64
	if b := r.URL.Query().Get("before"); b != "" {
		var err error
		if before, err = strconv.ParseInt(b, 10, 64); err != nil {
			return conversationView{}, errBadCursor
		}
	}
	rec, err := schema.ReadConversationRecord(r.Context(), s.db, key, before, s.cfg.PageSize)
	if err != nil {
		return conversationView{}, err
	}
	v := conversationView{ConversationRecord: rec, Paged: before > 0}
	if rec.OlderThan > 0 {
		v.Older = template.URL("/conversations/" + pathEscape(key) + "?before=" + strconv.FormatInt(rec.OlderThan, 10))
	}
	failed, err := schema.FailedTurnOf(r.Context(), s.db, key)
	switch {
	case err == nil:
		v.Failed = &failed
	case !errors.Is(err, schema.ErrNotFound):
		return v, err
	}
	if s.cfg.HideContent {
		v.hideContent()
	}
	return v, nil
}

var errBadCursor = errors.New("the page's cursor is not valid")

// hideContent blanks what users and agents wrote: messages, reasoning,
// step answers, tool arguments and results, questions and answers. What
// is left is metadata: ids, roles, statuses, sizes, times, errors of runs.
func (v *conversationView) hideContent() {
	v.Conversation.Title = ""
	for i := range v.Messages {
		m := &v.Messages[i]
		m.Content = hidden(m.Content)
		m.Reasoning = ""
	}
	for i := range v.Turns {
		t := &v.Turns[i]
		for j := range t.Steps {
			t.Steps[j].Answer = json.RawMessage(strconv.Quote(hidden(string(t.Steps[j].Answer))))
		}
		for j := range t.Operations {
			o := &t.Operations[j]
			o.Arguments, o.Result = hidden(o.Arguments), hidden(o.Result)
		}
		for j := range t.Approvals {
			a := &t.Approvals[j]
			a.Arguments, a.Question, a.Answer = nil, nil, nil
		}
	}
	if v.Failed != nil {
		for j := range v.Failed.Writes {
			o := &v.Failed.Writes[j]
			o.Arguments, o.Result = hidden(o.Arguments), hidden(o.Result)
		}
	}
}

func hidden(s string) string {
	if s == "" {
		return ""
	}
	return "(hidden: " + strconv.Itoa(len(s)) + " bytes)"
}

// conversationPage shows a conversation and records that the operator
// viewed its content (unless the console hides content). The page's live
// part refreshes from conversationLive, which is the same view.
func (s *Server) conversationPage(w http.ResponseWriter, r *http.Request) {
	v, ok := s.conversation(w, r)
	if !ok {
		return
	}
	if !s.cfg.HideContent {
		err := s.inTx(r.Context(), func(tx pgx.Tx) error {
			return schema.RecordOperatorActionTx(r.Context(), tx, operator(r), schema.ActionViewConversation, v.Conversation.Key, "")
		})
		if err != nil {
			s.failed(w, r, err)
			return
		}
	}
	s.render(w, r, http.StatusOK, "conversation", s.newView(r, "Conversation "+v.Conversation.PublicID, "conversations", v))
}

func (s *Server) conversationLive(w http.ResponseWriter, r *http.Request) {
	v, ok := s.conversation(w, r)
	if !ok {
		return
	}
	s.render(w, r, http.StatusOK, "conversation-live", s.newView(r, "", "conversations", v))
}

func (s *Server) conversation(w http.ResponseWriter, r *http.Request) (conversationView, bool) {
	v, err := s.readConversation(r)
	switch {
	case errors.Is(err, schema.ErrNotFound):
		s.errorPage(w, r, http.StatusNotFound, "No conversation has this key.")
		return v, false
	case errors.Is(err, errBadCursor):
		s.errorPage(w, r, http.StatusBadRequest, "The page's cursor is not valid.")
		return v, false
	case err != nil:
		s.failed(w, r, err)
		return v, false
	}
	return v, true
}
