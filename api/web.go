package api

import (
	_ "embed"
	"net/http"
)

// The web page is the reference client: an HTML file, its script and its
// style sheet, with no build step. Script and style are files of their own
// so that the Content-Security-Policy can refuse every inline script and
// style: text injected into the page could not run.
var (
	//go:embed web/index.html
	indexHTML []byte
	//go:embed web/app.js
	appJS []byte
	//go:embed web/app.css
	appCSS []byte
)

// contentSecurityPolicy allows the page's own script, style and API calls
// and nothing else: no inline code, no other origin, no plugin, no frame
// around the page (clickjacking).
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	s.asset("text/html; charset=utf-8", indexHTML)(w, r)
}

// asset serves one of the page's files with the page's security headers.
func (s *Server) asset(contentType string, body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", contentType)
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		_, _ = w.Write(body)
	}
}
