package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/schema"
)

type userKey struct{}

// tokenSource says where a route may take its token from.
type tokenSource int

const (
	// headerOnly: "Authorization: Bearer <token>" and nothing else. A token
	// in a URL ends up in proxy logs, browser history and Referer headers.
	headerOnly tokenSource = iota
	// headerOrQuery also takes ?access_token=, for EventSource, which
	// cannot set headers. Only the events route allows it.
	headerOrQuery
)

// auth requires "Authorization: Bearer <token>" and puts the user in the
// request context.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc { return s.authFrom(headerOnly, h) }

// authStream is auth for the events route, which also takes the token
// from ?access_token=.
func (s *Server) authStream(h http.HandlerFunc) http.HandlerFunc {
	return s.authFrom(headerOrQuery, h)
}

func (s *Server) authFrom(src tokenSource, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, problem := requestToken(r, src)
		if problem != "" {
			unauthorized(w, "", problem)
			return
		}
		if jwtauth.LooksLikeJWT(token) {
			u, ok := s.authenticateJWT(w, r, token)
			if ok {
				h(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
			}
			return
		}
		u, err := schema.Authenticate(r.Context(), s.pool, token)
		switch {
		case errors.Is(err, schema.ErrNotFound):
			unauthorized(w, "invalid_token", "the token is not valid: check that it was copied whole, or create one with `baton token create --user NAME`")
			return
		case errors.Is(err, schema.ErrTokenRevoked):
			unauthorized(w, "invalid_token", "the token was revoked: create a new one with `baton token create --user NAME`")
			return
		case errors.Is(err, schema.ErrTokenExpired):
			unauthorized(w, "invalid_token", "the token expired: create a new one with `baton token create --user NAME`")
			return
		case errors.Is(err, schema.ErrOperatorToken):
			unauthorized(w, "invalid_token", "the token is an operator's: it signs in to the console (baton console) only; a user's token comes from `baton token create --user NAME`")
			return
		case err != nil:
			s.internalError(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	}
}

// authenticateJWT verifies a JWT and returns its user, made on first
// sight; or answers the request and returns false. A refused token writes
// nothing.
func (s *Server) authenticateJWT(w http.ResponseWriter, r *http.Request, token string) (schema.User, bool) {
	if s.jwt == nil {
		unauthorized(w, "invalid_token", "this server accepts no JWTs, only Baton tokens: its operator sets --jwt-issuer or --jwt-hs256-secret-file to accept them")
		return schema.User{}, false
	}
	id, err := s.jwt.Verify(r.Context(), token)
	if err != nil {
		var refused *jwtauth.Error
		if !errors.As(err, &refused) {
			s.internalError(w, r, err)
			return schema.User{}, false
		}
		unauthorized(w, "invalid_token", refused.Error())
		return schema.User{}, false
	}
	u, err := schema.EnsureUser(r.Context(), s.pool, id.UserName())
	if err != nil {
		s.internalError(w, r, err)
		return schema.User{}, false
	}
	// No token row: the stream ends at the token's expiry, and a JWT
	// cannot be revoked before it (the issuer keeps them short).
	u.TokenExpiresAt = id.Expiry
	return u, true
}

// unauthorized answers 401 with a WWW-Authenticate challenge (RFC 6750).
func unauthorized(w http.ResponseWriter, bearerError, message string) {
	challenge := `Bearer realm="baton"`
	if bearerError != "" {
		challenge += `, error="` + bearerError + `"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, http.StatusUnauthorized, "unauthorized", message)
}

// requestToken returns the request's token, or what is wrong with the way
// it was sent. The messages never repeat the token.
func requestToken(r *http.Request, src tokenSource) (token, problem string) {
	query := r.URL.Query().Get("access_token")
	if query != "" && src == headerOnly {
		return "", "a token in the URL (?access_token=) is accepted only by GET /v1/conversations/{cid}/events: send it in the Authorization header, as Authorization: Bearer <token>"
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		if query != "" {
			return query, ""
		}
		return "", "missing bearer token: send Authorization: Bearer <token> (create one with `baton token create --user NAME`)"
	}
	scheme, token, ok := strings.Cut(h, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", "the Authorization header must be `Bearer <token>`, with one token"
	}
	return token, ""
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
	if schema.IsUnavailable(err) {
		// The database is away for a moment (a restart, a failover): the
		// client retries, with the same message id, which never makes a
		// second turn.
		s.log.Warn().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("database unavailable")
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the service is briefly unavailable; try again in a few seconds (a message sent again with the same id is stored once)")
		return
	}
	s.log.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request failed")
	writeError(w, http.StatusInternalServerError, "internal", "internal error; the server log has the details")
}
