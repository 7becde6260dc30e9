package console

import (
	"errors"
	"html/template"
	"net/http"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/schema"
)

// deadLettersView lists the groups: those that parked events, and the
// durable consumers of the stream (from the overview's data).
type deadLettersView struct {
	Groups []deadLetterGroup
}

type deadLetterGroup struct {
	Name   string
	Open   int64
	Oldest string
	// Consumer says the stream has a durable of this name.
	Consumer bool
}

func (s *Server) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	counts, err := schema.DeadLetterGroups(r.Context(), s.db)
	if err != nil {
		s.failed(w, r, err)
		return
	}
	byName := map[string]*deadLetterGroup{}
	var v deadLettersView
	for _, c := range counts {
		byName[c.Group] = &deadLetterGroup{Name: c.Group, Open: c.Open, Oldest: ago(c.OldestParked)}
	}
	if d := s.overviewData(r.Context()); d.Report != nil {
		for _, g := range d.Report.Groups {
			if byName[g.Name] == nil {
				byName[g.Name] = &deadLetterGroup{Name: g.Name}
			}
			byName[g.Name].Consumer = true
		}
	}
	for _, g := range byName {
		v.Groups = append(v.Groups, *g)
	}
	sort.Slice(v.Groups, func(i, j int) bool { return v.Groups[i].Name < v.Groups[j].Name })
	s.render(w, r, http.StatusOK, "deadletters", s.newView(r, "Dead letters", "deadletters", v))
}

// groupDeadLettersView is one group's unresolved dead letters.
type groupDeadLettersView struct {
	Group       string
	DeadLetters []schema.DeadLetter
	Next        template.URL
}

func (s *Server) groupDeadLettersPage(w http.ResponseWriter, r *http.Request) {
	group := r.PathValue("group")
	var after int64
	if a := r.URL.Query().Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseInt(a, 10, 64); err != nil {
			s.errorPage(w, r, http.StatusBadRequest, "The page's cursor is not valid.")
			return
		}
	}
	dead, err := schema.DeadLetterPage(r.Context(), s.db, group, after, s.cfg.PageSize+1)
	if err != nil {
		s.failed(w, r, err)
		return
	}
	v := groupDeadLettersView{Group: group, DeadLetters: dead}
	if len(dead) > s.cfg.PageSize {
		v.DeadLetters = dead[:s.cfg.PageSize]
		v.Next = template.URL("/dead-letters/" + pathEscape(group) + "?after=" + strconv.FormatInt(v.DeadLetters[len(v.DeadLetters)-1].ID, 10))
	}
	if s.cfg.HideContent {
		for i := range v.DeadLetters {
			v.DeadLetters[i].Payload = []byte(hidden(string(v.DeadLetters[i].Payload)))
		}
	}
	s.render(w, r, http.StatusOK, "groupdeadletters", s.newView(r, "Dead letters of "+group, "deadletters", v))
}

// deadLetterAction runs act on one dead letter in a transaction that also
// records the operator's action.
func (s *Server) deadLetterAction(w http.ResponseWriter, r *http.Request, action, notice string,
	act func(tx pgx.Tx, group string, id int64) error) {
	group := r.PathValue("group")
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.errorPage(w, r, http.StatusNotFound, "No such dead letter.")
		return
	}
	op := operator(r)
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		if err := act(tx, group, id); err != nil {
			return err
		}
		return schema.RecordOperatorActionTx(r.Context(), tx, op, action, group+"/"+strconv.FormatInt(id, 10), "")
	})
	switch {
	case errors.Is(err, schema.ErrNotFound):
		s.errorPage(w, r, http.StatusNotFound, "The group has no such dead letter.")
		return
	case errors.Is(err, schema.ErrResolved):
		s.errorPage(w, r, http.StatusConflict, "The dead letter was resolved already.")
		return
	case err != nil:
		s.failed(w, r, err)
		return
	}
	s.log.Info().Str("operator", op.Name).Str("group", group).Int64("dead_letter", id).Str("action", action).Msg("operator acted on a dead letter")
	redirect(w, r, "/dead-letters/"+pathEscape(group), notice)
}

// discardDeadLetter gives a parked event up, as `baton group dead-letters
// discard` does: resolved as discarded, and recorded in the group's inbox
// so that no replay applies it later.
func (s *Server) discardDeadLetter(w http.ResponseWriter, r *http.Request) {
	s.deadLetterAction(w, r, schema.ActionDiscardDeadLetter, "discarded", func(tx pgx.Tx, group string, id int64) error {
		_, err := schema.DiscardDeadLetterTx(r.Context(), tx, group, id)
		return err
	})
}

// retryDeadLetter marks a parked event for retry; the group's own process,
// which has the handler, applies it.
func (s *Server) retryDeadLetter(w http.ResponseWriter, r *http.Request) {
	s.deadLetterAction(w, r, schema.ActionRetryDeadLetter, "retry-requested", func(tx pgx.Tx, group string, id int64) error {
		_, err := schema.RequestDeadLetterRetryTx(r.Context(), tx, group, id, operator(r).Name)
		return err
	})
}
