package securetest

import (
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// secret is a value that must never appear in a process's output.
type secret struct {
	name  string
	value string
}

// minSecretForm is the shortest form searched for: a shorter one would
// match ordinary text.
const minSecretForm = 8

// forms returns the ways a secret may be written out: as it is, percent-
// encoded for a query, a path or a URL's user information, and escaped
// for a JSON string (what a JSON log line holds), also of the encoded
// forms.
func (s secret) forms() []string {
	seen := map[string]bool{}
	var out []string
	add := func(v string) {
		if len(v) >= minSecretForm && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	userInfo := strings.TrimPrefix(url.UserPassword("u", s.value).String(), "u:")
	for _, v := range []string{s.value, url.QueryEscape(s.value), url.PathEscape(s.value), userInfo} {
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

// fileSecret is the content of a secret file, without the newline at its
// end.
func fileSecret(t *testing.T, name, path string) secret {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return secret{name: name, value: strings.TrimSpace(string(b))}
}

// secretIn returns the form of s that line holds, or "".
func secretIn(line string, s secret) string {
	for _, f := range s.forms() {
		if strings.Contains(line, f) {
			return f
		}
	}
	return ""
}

// mask replaces every form of s in line, for a failure message that does
// not itself spread the secret.
func mask(line string, s secret) string {
	for _, f := range s.forms() {
		line = strings.ReplaceAll(line, f, "<"+s.name+">")
	}
	return line
}

// requireNoSecret fails t for every line of every process that holds a
// form of a secret, naming the process, the stream and the line number,
// with the secret masked. allowed exempts the lines a process is meant to
// print a secret on (`baton token create` prints the token it made).
func (ps *processes) requireNoSecret(t *testing.T, secrets []secret, allowed func(p *process, l outputLine, s secret) bool) {
	t.Helper()
	ps.mu.Lock()
	all := append([]*process(nil), ps.all...)
	ps.mu.Unlock()
	lines := 0
	for _, p := range all {
		for _, l := range p.output() {
			lines++
			for _, s := range secrets {
				if secretIn(l.text, s) == "" || (allowed != nil && allowed(p, l, s)) {
					continue
				}
				t.Errorf("%s wrote the %s on %s, line %d:\n    %s", p.name, s.name, l.stream, l.n, mask(l.text, s))
			}
		}
	}
	t.Logf("searched %d lines of %d processes for %d secrets", lines, len(all), len(secrets))
}

// TestSecretSearchFindsEveryForm: the search of the outputs finds a
// secret however a line writes it, so a leak cannot hide behind an
// encoding.
func TestSecretSearchFindsEveryForm(t *testing.T) {
	t.Parallel()
	s := secret{name: "password", value: `p@ss/w:rd?&"x`}
	for _, line := range []string{
		`connect to nats://u:p@ss/w:rd?&"x@host:4222`,
		`{"url":"postgres://u:p%40ss%2Fw%3Ard%3F&%22x@host/db"}`,
		`{"url":"postgres://u:p%40ss%2Fw%3Ard%3F%26%22x@host/db"}`,
		`{"error":"password p@ss/w:rd?\u0026\"x refused"}`,
		`{"error":"password p@ss/w:rd?&\"x refused"}`,
		`{"query":"password=p%40ss%2Fw%3Ard%3F%26%22x"}`,
	} {
		require.NotEmpty(t, secretIn(line, s), "the search should find the secret in %s", line)
		require.Empty(t, secretIn(mask(line, s), s), "the mask should hide it in %s", line)
	}
	require.Empty(t, secretIn(`{"url":"nats://redacted@host:4222"}`, s))
}
