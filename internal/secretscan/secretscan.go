// Package secretscan finds secrets in what a process wrote: a value may be
// written as it is, percent-encoded (in a URL's query, path or user
// information) or escaped for a JSON string, and each form is searched.
// Tests that run Baton's processes search every line of their output with
// it, and mask what they found before they show the line.
package secretscan

import (
	"encoding/json"
	"net/url"
	"strings"
)

// Secret is a value that must never appear in a process's output.
type Secret struct {
	// Name says which secret it is in a failure (the model API key).
	Name string
	// Value is the secret.
	Value string
}

// MinForm is the shortest form searched for: a shorter one would match
// ordinary text.
const MinForm = 8

// Forms returns the ways the secret may be written out: as it is,
// percent-encoded for a query, a path or a URL's user information, and
// escaped for a JSON string (what a JSON log line holds), also of the
// encoded forms.
func (s Secret) Forms() []string {
	seen := map[string]bool{}
	var out []string
	add := func(v string) {
		if len(v) >= MinForm && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	userInfo := strings.TrimPrefix(url.UserPassword("u", s.Value).String(), "u:")
	for _, v := range []string{s.Value, url.QueryEscape(s.Value), url.PathEscape(s.Value), userInfo} {
		add(v)
		// JSON as encoding/json writes it (<, > and & escaped) and as
		// zerolog does (not).
		b, _ := json.Marshal(v)
		add(strings.Trim(string(b), `"`))
		var plain strings.Builder
		enc := json.NewEncoder(&plain)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		add(strings.Trim(strings.TrimSpace(plain.String()), `"`))
	}
	return out
}

// In returns the form of s that line holds, or "".
func (s Secret) In(line string) string {
	for _, f := range s.Forms() {
		if strings.Contains(line, f) {
			return f
		}
	}
	return ""
}

// Mask replaces every form of s in line with <name>, for a failure
// message that does not itself spread the secret.
func (s Secret) Mask(line string) string {
	for _, f := range s.Forms() {
		line = strings.ReplaceAll(line, f, "<"+s.Name+">")
	}
	return line
}

// MaskAll masks every secret of secrets in line.
func MaskAll(line string, secrets []Secret) string {
	for _, s := range secrets {
		line = s.Mask(line)
	}
	return line
}
