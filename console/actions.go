package console

import (
	"html/template"
	"net/http"
	"strconv"

	"github.com/batonhq/baton/schema"
)

// actionsView is a page of operator_actions, newest first.
type actionsView struct {
	Actions []schema.OperatorAction
	Next    template.URL
}

func (s *Server) actionsPage(w http.ResponseWriter, r *http.Request) {
	var before int64
	if b := r.URL.Query().Get("before"); b != "" {
		var err error
		if before, err = strconv.ParseInt(b, 10, 64); err != nil {
			s.errorPage(w, r, http.StatusBadRequest, "The page's cursor is not valid.")
			return
		}
	}
	actions, err := schema.OperatorActions(r.Context(), s.db, before, s.cfg.PageSize+1)
	if err != nil {
		s.failed(w, r, err)
		return
	}
	v := actionsView{Actions: actions}
	if len(actions) > s.cfg.PageSize {
		v.Actions = actions[:s.cfg.PageSize]
		v.Next = template.URL("/actions?before=" + strconv.FormatInt(v.Actions[len(v.Actions)-1].ID, 10))
	}
	s.render(w, r, http.StatusOK, "actions", s.newView(r, "Operator actions", "actions", v))
}
