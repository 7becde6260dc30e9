package agent

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// checkCut checks cut(s, n): s itself when it fits; else at most n bytes
// (or the bare marker when n cannot hold one), valid UTF-8 when s is, made
// of a start of s, the marker and an end of s, and of the length cutLen
// promises at most.
func checkCut(t *testing.T, s string, n int) {
	got := cut(s, n)
	if len(s) <= n {
		require.Equal(t, s, got)
		return
	}
	require.LessOrEqual(t, len(got), cutLen(len(s), n), "cutLen(%d, %d) is a bound", len(s), n)
	require.Less(t, len(got), len(s)+len(leftOut(len(s))))
	if utf8.ValidString(s) {
		require.True(t, utf8.ValidString(got), "%q cut to %d is not UTF-8", s, n)
	}
	if got == leftOut(len(s)) {
		return
	}
	require.LessOrEqual(t, len(got), n)
	i := strings.Index(got, "\n[... ")
	j := strings.Index(got, " ...]\n")
	require.True(t, i >= 0 && j > i, "no marker in %q", got)
	head, tail := got[:i], got[j+len(" ...]\n"):]
	require.True(t, strings.HasPrefix(s, head))
	require.True(t, strings.HasSuffix(s, tail))
	require.Equal(t, marker(len(s)-len(head)-len(tail)), got[i:j+len(" ...]\n")], "the marker says how much was left out")
}

func TestCutKeepsTheStartAndTheEndWithinTheLimit(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "short", strings.Repeat("ab", 500), strings.Repeat("日本語", 300), strings.Repeat("😀x", 400)} {
		for n := 0; n <= len(s)+10; n += 7 {
			checkCut(t, s, n)
		}
	}
}

func FuzzCut(f *testing.F) {
	f.Add(strings.Repeat("日本語 and more ", 20), 90)
	f.Add("x", 0)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<20 {
			return
		}
		checkCut(t, s, n)
	})
}
