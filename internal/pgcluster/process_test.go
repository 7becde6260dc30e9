package pgcluster

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseStatCountsFieldsFromTheLastParenthesis(t *testing.T) {
	st, ppid, ok := parseStat("4242 (postgres: walreceiver (x) y) T 17 4242 4242 0 -1\n")
	require.True(t, ok)
	require.Equal(t, "T", st)
	require.Equal(t, 17, ppid)
	_, _, ok = parseStat("4242 postgres")
	require.False(t, ok)
}

func TestDescendantsFindsTheChildrenOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	_, ok := processState(os.Getpid())
	require.True(t, ok)
	require.Contains(t, descendants(os.Getppid()), os.Getpid())
}
