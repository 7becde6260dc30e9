package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/schema"
)

// Sign-in and sessions. An operator signs in once with an operator token
// (or a JWT whose claim names an operator's role); the console keeps a
// session in PostgreSQL and hands the browser a random secret in an
// HttpOnly, SameSite=Strict cookie (Secure over TLS), of which PostgreSQL
// holds only the SHA-256. Every form carries the session's CSRF token, an
// HMAC of the secret that the page shows and the cookie does not: a page
// of another origin can make the browser send the cookie (not with
// SameSite=Strict, but a browser or a proxy may get that wrong) and never
// read the token.

// Cookie names. Over TLS the session cookie takes the __Host- prefix,
// which browsers accept only Secure, for this host and path /.
const (
	sessionCookie       = "baton_console"
	secureSessionCookie = "__Host-baton_console"
	signInCookie        = "baton_console_signin"
	csrfField           = "csrf"
	maxFormBytes        = 64 << 10
)

// session is the signed-in operator of a request.
type session struct {
	schema.ConsoleSession
	csrf string
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// operator is the signed-in operator of a request.
func operator(r *http.Request) schema.Operator { return sessionFrom(r.Context()).Operator }

func randomSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func secretHash(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// csrfToken is the session's CSRF token: derived from the secret, so that
// nothing more is stored and it changes with every session.
func csrfToken(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("baton console csrf"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (s *Server) secure(r *http.Request) bool { return r.TLS != nil || s.cfg.SecureCookies }

func (s *Server) sessionCookieName(r *http.Request) string {
	if s.secure(r) {
		return secureSessionCookie
	}
	return sessionCookie
}

// signedIn runs h for a request with a live session; without one, a page
// goes to the sign-in page and a refresh of part of a page (htmx) is told
// to. A POST must carry the session's CSRF token.
func (s *Server) signedIn(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess, err := s.readSession(r)
		if err != nil {
			if !errors.Is(err, schema.ErrNotFound) && !errors.Is(err, schema.ErrSessionEnded) {
				s.failed(w, r, err)
				return
			}
			if r.Header.Get("HX-Request") != "" {
				w.Header().Set("HX-Redirect", "/signin")
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if r.Method != http.MethodGet {
				s.errorPage(w, r, http.StatusUnauthorized, "Your session ended: sign in again.")
				return
			}
			http.Redirect(w, r, "/signin", http.StatusSeeOther)
			return
		}
		ctx := context.WithValue(r.Context(), sessionKey{}, sess)
		r = r.WithContext(ctx)
		if r.Method == http.MethodPost && !s.checkCSRF(w, r, sess.csrf) {
			return
		}
		h(w, r)
	})
}

// admin is signedIn for what only an admin may do: a viewer gets 403.
func (s *Server) admin(h http.HandlerFunc) http.Handler {
	return s.signedIn(func(w http.ResponseWriter, r *http.Request) {
		if !operator(r).CanAct() {
			s.errorPage(w, r, http.StatusForbidden, "You signed in as a viewer: a viewer reads, and only an admin acts.")
			return
		}
		h(w, r)
	})
}

// checkCSRF refuses a form without the expected token, or sent by a page
// of another site (Sec-Fetch-Site, where the browser sends it).
func (s *Server) checkCSRF(w http.ResponseWriter, r *http.Request, want string) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		s.errorPage(w, r, http.StatusForbidden, "The form was sent from another site: the console refuses it.")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
		return false
	}
	got := r.PostForm.Get(csrfField)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		s.errorPage(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
		return false
	}
	return true
}

// readSession finds the live session of the request's cookie.
func (s *Server) readSession(r *http.Request) (*session, error) {
	var secret string
	for _, name := range []string{secureSessionCookie, sessionCookie} {
		if c, err := r.Cookie(name); err == nil && c.Value != "" {
			secret = c.Value
			break
		}
	}
	if secret == "" {
		return nil, schema.ErrNotFound
	}
	cs, err := schema.ConsoleSessionBySecret(r.Context(), s.db, secretHash(secret), s.cfg.SessionIdle)
	if err != nil {
		return nil, err
	}
	return &session{ConsoleSession: cs, csrf: csrfToken(secret)}, nil
}

// signInView is what the sign-in page shows.
type signInView struct {
	// Nonce is the value of the sign-in cookie, sent back with the form.
	Nonce   string
	JWT     bool
	Problem string
}

// signInPage shows the form; a signed-in operator goes to the overview.
func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	if _, err := s.readSession(r); err == nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.renderSignIn(w, r, http.StatusOK, "")
}

// renderSignIn shows the form with a fresh sign-in nonce: a cookie and the
// same value in the form, so that a page of another site cannot sign the
// browser in as someone else.
func (s *Server) renderSignIn(w http.ResponseWriter, r *http.Request, status int, problem string) {
	nonce, err := randomSecret()
	if err != nil {
		s.failed(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: signInCookie, Value: nonce, Path: "/signin", MaxAge: 600,
		HttpOnly: true, Secure: s.secure(r), SameSite: http.SameSiteStrictMode,
	})
	v := s.newView(r, "Sign in", "", signInView{Nonce: nonce, JWT: s.jwt != nil, Problem: problem})
	v.Session = nil
	s.render(w, r, status, "signin", v)
}

// signIn checks the token of the form, starts a session and records the
// sign-in. Attempts are limited per client address.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	if wait := s.signIns.Take(clientAddress(r), time.Now()); wait > 0 {
		w.Header().Set("Retry-After", retryAfter(wait))
		s.renderSignIn(w, r, http.StatusTooManyRequests, "Too many sign-in attempts from this address: try again in "+shortDuration(wait.Round(time.Second))+".")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.renderSignIn(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	c, err := r.Cookie(signInCookie)
	nonce := r.PostForm.Get(csrfField)
	if err != nil || nonce == "" || subtle.ConstantTimeCompare([]byte(c.Value), []byte(nonce)) != 1 {
		s.renderSignIn(w, r, http.StatusForbidden, "The sign-in form expired or came from another site: try again.")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" {
		s.renderSignIn(w, r, http.StatusUnauthorized, "Give an operator token.")
		return
	}
	op, expires, status, problem := s.authenticate(r.Context(), token)
	if status != http.StatusOK {
		if status == http.StatusInternalServerError {
			s.failed(w, r, errors.New(problem))
			return
		}
		s.renderSignIn(w, r, status, problem)
		return
	}
	secret, err := randomSecret()
	if err != nil {
		s.failed(w, r, err)
		return
	}
	if max := time.Now().Add(s.cfg.SessionMaxAge); expires.IsZero() || expires.After(max) {
		expires = max
	}
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		if _, err := schema.StartConsoleSession(r.Context(), tx, op, secretHash(secret), expires); err != nil {
			return err
		}
		return schema.RecordOperatorActionTx(r.Context(), tx, op, schema.ActionSignIn, "", "as "+string(op.Role)+signInMethod(op))
	})
	if err != nil {
		s.failed(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: "", Path: "/signin", MaxAge: -1, HttpOnly: true, Secure: s.secure(r), SameSite: http.SameSiteStrictMode})
	http.SetCookie(w, &http.Cookie{
		Name: s.sessionCookieName(r), Value: secret, Path: "/", Expires: expires,
		HttpOnly: true, Secure: s.secure(r), SameSite: http.SameSiteStrictMode,
	})
	s.log.Info().Str("operator", op.Name).Str("role", string(op.Role)).Msg("operator signed in")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func signInMethod(op schema.Operator) string {
	if op.TokenID != 0 {
		return ", operator token"
	}
	return ", JWT"
}

// authenticate says who a token signs in, and until when at the latest;
// otherwise the status to answer (401, 403) and why, in words for the
// operator that never repeat the token.
func (s *Server) authenticate(ctx context.Context, token string) (schema.Operator, time.Time, int, string) {
	if jwtauth.LooksLikeJWT(token) {
		if s.jwt == nil {
			return schema.Operator{}, time.Time{}, http.StatusUnauthorized, "This console takes no JWT: sign in with an operator token (baton token create --user NAME --admin or --viewer)."
		}
		id, err := s.jwt.Verify(ctx, token)
		var je *jwtauth.Error
		if errors.As(err, &je) {
			return schema.Operator{}, time.Time{}, http.StatusUnauthorized, "The JWT was refused: " + je.Error() + "."
		}
		if err != nil {
			return schema.Operator{}, time.Time{}, http.StatusInternalServerError, err.Error()
		}
		op := schema.Operator{Name: id.UserName()}
		switch {
		case s.cfg.AdminClaim.Name != "" && id.HasClaim(s.cfg.AdminClaim.Name, s.cfg.AdminClaim.Value):
			op.Role = schema.RoleAdmin
		case s.cfg.ViewerClaim.Name != "" && id.HasClaim(s.cfg.ViewerClaim.Name, s.cfg.ViewerClaim.Value):
			op.Role = schema.RoleViewer
		default:
			return op, time.Time{}, http.StatusForbidden, "The JWT is valid, but it names no operator: its claims hold neither " +
				s.cfg.AdminClaim.String() + " nor " + s.cfg.ViewerClaim.String() + "."
		}
		return op, id.Expiry, http.StatusOK, ""
	}
	op, err := schema.AuthenticateOperator(ctx, s.db, token)
	switch {
	case errors.Is(err, schema.ErrNotOperator):
		return op, time.Time{}, http.StatusForbidden, "This is a user's token: the console takes an operator token (baton token create --user NAME --admin or --viewer)."
	case errors.Is(err, schema.ErrNotFound):
		return op, time.Time{}, http.StatusUnauthorized, "The token is not valid: check that it was copied whole."
	case errors.Is(err, schema.ErrTokenRevoked):
		return op, time.Time{}, http.StatusUnauthorized, "The token was revoked: create a new one with baton token create."
	case errors.Is(err, schema.ErrTokenExpired):
		return op, time.Time{}, http.StatusUnauthorized, "The token expired: create a new one with baton token create."
	case err != nil:
		return op, time.Time{}, http.StatusInternalServerError, err.Error()
	}
	return op, op.TokenExpiresAt, http.StatusOK, ""
}

// signOut ends the session, records it and clears the cookie.
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	sess := sessionFrom(r.Context())
	err := s.inTx(r.Context(), func(tx pgx.Tx) error {
		if err := schema.EndConsoleSession(r.Context(), tx, sess.ID); err != nil {
			return err
		}
		return schema.RecordOperatorActionTx(r.Context(), tx, sess.Operator, schema.ActionSignOut, "", "")
	})
	if err != nil {
		s.failed(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: s.sessionCookieName(r), Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.secure(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// clientAddress is the address sign-in attempts are counted by: the
// connection's peer. Behind a proxy every operator shares the proxy's.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
