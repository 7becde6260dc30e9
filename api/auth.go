package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/batonhq/baton/schema"
)

type userKey struct{}

// auth requires "Authorization: Bearer <token>" and puts the user in the
// request context.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing bearer token: send Authorization: Bearer <token> (create one with `baton token create --user NAME`)")
			return
		}
		u, err := schema.Authenticate(r.Context(), s.pool, token)
		if errors.Is(err, schema.ErrNotFound) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "the token is not valid or was revoked")
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	}
}

func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		// EventSource cannot set headers: the events endpoint and the web
		// page may pass the token as a query parameter instead.
		if t := r.URL.Query().Get("access_token"); t != "" {
			return t, true
		}
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func userFrom(ctx context.Context) schema.User {
	u, _ := ctx.Value(userKey{}).(schema.User)
	return u
}

func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went away; nothing to report.
		return
	}
	s.log.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request failed")
	writeError(w, http.StatusInternalServerError, "internal", "internal error; the server log has the details")
}
