package securetest

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/secretscan"
)

// secret is a value that must never appear in a process's output.
type secret = secretscan.Secret

// fileSecret is the content of a secret file, without the newline at its
// end.
func fileSecret(t *testing.T, name, path string) secret {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return secret{Name: name, Value: strings.TrimSpace(string(b))}
}

// requireNoSecret fails t for every line of every process that holds a
// form of a secret, naming the process, the stream and the line number,
// with the secret masked. allowed exempts the lines a process is meant to
// print a secret on (`baton token create` prints the token it made).
func (ps *processes) requireNoSecret(t *testing.T, secrets []secret, allowed func(p *process, l outputLine, s secret) bool) {
	t.Helper()
	all := ps.group.All()
	lines := 0
	for _, p := range all {
		for _, l := range p.Output() {
			lines++
			for _, s := range secrets {
				if s.In(l.Text) == "" || (allowed != nil && allowed(p, l, s)) {
					continue
				}
				t.Errorf("%s wrote the %s on %s, line %d:\n    %s", p.Name, s.Name, l.Stream, l.N, s.Mask(l.Text))
			}
		}
	}
	t.Logf("searched %d lines of %d processes for %d secrets", lines, len(all), len(secrets))
}
