package api

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/batonhq/baton/internal/setting"
)

// CORS: the pages of the origins in Config.CORSOrigins may call every /v1
// route from the browser, with a bearer token in Authorization (never
// cookies, so no credentials mode). Other origins get no CORS headers,
// which is what the browser needs to keep their pages from reading an
// answer; a preflight from one is answered 403.
const (
	// corsAllowMethods are the methods of the /v1 routes.
	corsAllowMethods = "GET, POST, PATCH, DELETE"
	// corsAllowHeaders are the request headers a page may send: the token,
	// a JSON body, where an event stream resumes, and a trace context.
	corsAllowHeaders = "Authorization, Content-Type, Last-Event-ID, traceparent, tracestate"
	// corsExposeHeaders are the answer headers a page may read beyond the
	// safelisted ones: when to try again, where a new thing is, why a
	// token was refused, and the AI SDK's marker of its UI message
	// stream.
	corsExposeHeaders = "Retry-After, Location, WWW-Authenticate, x-vercel-ai-ui-message-stream"
	// corsMaxAge is how long, in seconds, a browser may keep a preflight's
	// answer.
	corsMaxAge = "600"
)

// validateCORSOrigins refuses anything but exact origins:
// scheme://host[:port], no path, no wildcard.
func validateCORSOrigins(origins []string) error {
	for _, o := range origins {
		if strings.Contains(o, "*") {
			return setting.Errorf("CORSOrigins", o, "wildcards are not allowed: list each origin exactly, such as https://app.example")
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
			u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
			return setting.Errorf("CORSOrigins", o, "must be an origin, scheme://host[:port] with nothing after it, such as https://app.example")
		}
		if o != strings.ToLower(u.Scheme)+"://"+strings.ToLower(u.Host) {
			return setting.Errorf("CORSOrigins", o, "must be written as browsers send it: lower case, such as %s://%s", strings.ToLower(u.Scheme), strings.ToLower(u.Host))
		}
	}
	return nil
}

// cors answers preflights of /v1 routes and marks the answers to the
// allowed origins. Without origins it changes nothing.
func (s *Server) cors(next http.Handler) http.Handler {
	if len(s.cfg.CORSOrigins) == 0 {
		return next
	}
	allowed := make(map[string]bool, len(s.cfg.CORSOrigins))
	for _, o := range s.cfg.CORSOrigins {
		allowed[o] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		// An answer depends on the origin that asked: no cache may hand
		// one origin's answer to another.
		h.Add("Vary", "Origin")
		origin := r.Header.Get("Origin")
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		if preflight {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
		}
		if !allowed[origin] {
			if preflight {
				writeError(w, http.StatusForbidden, "origin_not_allowed",
					"this origin may not call the API from a browser: the operator adds it to --cors-origins (BATON_CORS_ORIGINS)")
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		if preflight {
			h.Set("Access-Control-Allow-Methods", corsAllowMethods)
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", corsMaxAge)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		next.ServeHTTP(w, r)
	})
}
