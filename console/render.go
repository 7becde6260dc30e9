package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/batonhq/baton/internal/status"
)

// view is what every page template receives.
type view struct {
	Title string
	// Nav is the menu entry the page belongs to.
	Nav     string
	Session *session
	// Refresh is how often the page's live parts refresh, in seconds.
	Refresh     int
	HideContent bool
	// Notice is a short message about what the last action did.
	Notice string
	// Message is an error page's text.
	Message string
	Data    any
}

// CanAct reports whether the signed-in operator may act.
func (v view) CanAct() bool { return v.Session != nil && v.Session.Operator.CanAct() }

// CSRF is the session's token for the hidden field of every form.
func (v view) CSRF() string {
	if v.Session == nil {
		return ""
	}
	return v.Session.csrf
}

// notices are the messages an action's redirect may show, by their code:
// a page shows only these, never text from the address.
var notices = map[string]string{
	"retried":          "The turn was put back to be answered: a worker takes it now.",
	"resumed":          "The turn goes on from its journal: a worker takes it now, and the recorded outcome answers the call.",
	"outcome":          "The outcome was recorded. Retry the turn to have it go on from its journal.",
	"discarded":        "The dead letter was discarded: no replay applies it.",
	"retry-requested":  "The dead letter is marked for retry: its group's process applies it.",
	"nothing-to-retry": "Nothing to retry: the turn is no longer failed.",
}

func (s *Server) newView(r *http.Request, title, nav string, data any) view {
	return view{
		Title: title, Nav: nav, Session: sessionFrom(r.Context()), Data: data,
		Refresh:     max(1, int(s.cfg.RefreshInterval/time.Second)),
		HideContent: s.cfg.HideContent,
		Notice:      notices[r.URL.Query().Get("notice")],
	}
}

// pageNames are the templates of whole pages; fragments are templates
// that pages include and htmx swaps in.
var pageNames = []string{"signin", "error", "overview", "conversations", "conversation", "turns", "deadletters", "groupdeadletters", "actions"}

// parsePages parses the layout and the fragments once for each page, so
// that each page defines its own "content".
func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/fragments.html")
	if err != nil {
		return nil, fmt.Errorf("parse the console's templates: %w", err)
	}
	pages := map[string]*template.Template{"": base}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFiles, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("parse the console's page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render writes the page name with v, or a fragment when the name is one
// of the fragments (the base set).
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, v view) {
	t, ok := s.pages[name]
	exec := "layout.html"
	if !ok {
		t, exec = s.pages[""], name
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, exec, v); err != nil {
		s.log.Error().Err(err).Str("template", name).Msg("render a console page")
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

var funcs = template.FuncMap{
	"ago":      ago,
	"when":     when,
	"dur":      shortDuration,
	"bytes":    humanBytes,
	"short":    shortText,
	"pretty":   prettyJSON,
	"path":     pathEscape,
	"query":    urlQueryEscape,
	"deref":    deref,
	"derefInt": derefInt,
	"lines":    func(s string) []string { return strings.Split(s, "\n") },
	"add":      func(a, b int) int { return a + b },
	"stalled":  func(d status.Duration) time.Duration { return time.Duration(d) },
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

func pathEscape(s string) string { return url.PathEscape(s) }

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func derefInt(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

// when is a time as operators read it: UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is how long ago t was.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + shortDuration(-d)
	}
	return shortDuration(d) + " ago"
}

func shortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func humanBytes(n any) string {
	var v float64
	switch n := n.(type) {
	case int64:
		v = float64(n)
	case uint64:
		v = float64(n)
	case int:
		v = float64(n)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// shortText cuts s to n characters.
func shortText(n int, s string) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// prettyJSON indents JSON for reading; what is not JSON is shown as it is.
func prettyJSON(v any) string {
	var b []byte
	switch v := v.(type) {
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	case string:
		b = []byte(v)
	}
	if len(b) == 0 || string(b) == "null" {
		return ""
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

// localPath reports whether p is a path of this console to go back to
// after an action: never another origin.
func localPath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "//") && !strings.Contains(p, "\\") && path.Clean(p) != ""
}
