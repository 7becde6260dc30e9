package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMergeKeepsTheFiguresOfBenchmarksThatDidNotRunAndReplacesTheOthers(t *testing.T) {
	t.Parallel()
	prev := []Figure{
		{ID: "2a", Bench: "BenchmarkTurns", Value: "2,000", Run: "2026-01-01"},
		{ID: "10a", Bench: "BenchmarkPages", Value: "3.00 ms", Run: "2026-01-01"},
		{ID: "F1a", Bench: "BenchmarkFloor", Value: "10.0 ms", Ratio: 2, Run: "2026-01-01"},
		{ID: "F1z", Bench: "BenchmarkFloor", Value: "gone", Run: "2026-01-01"},
	}
	cur := []Figure{{ID: "F1a", Bench: "BenchmarkFloor", Value: "8.00 ms", Ratio: 1.5}, {ID: "2a", Bench: "BenchmarkTurns", Value: "2,200"}}
	all := Merge(prev, cur, "2026-02-01")
	var ids []string
	for _, f := range all {
		ids = append(ids, f.ID+" "+f.Run)
	}
	require.Equal(t, []string{"2a 2026-02-01", "10a 2026-01-01", "F1a 2026-02-01"}, ids,
		"want this run's figures, the earlier ones of benchmarks that did not run, numbers in order")

	before := ByKey(prev)
	require.Equal(t, "+10%", Change(all[0], before))
	require.Equal(t, "not run this time", Change(all[1], before))
	require.Equal(t, "-20%, ratio 2.00→1.50", Change(all[2], before))
	require.Equal(t, "new", Change(Figure{ID: "9a", Bench: "BenchmarkConsole"}, before))
}

func TestTheTablesReplaceOnlyWhatLiesBetweenTheMarkers(t *testing.T) {
	t.Parallel()
	figs := []Figure{{ID: "1a", Name: "a | b", Value: "1.00 ms", Bench: "BenchmarkX", Package: "./x/", Run: "2026-02-01"}}
	var b strings.Builder
	require.NoError(t, WriteMarkdown(&b, figs, nil))
	require.Contains(t, b.String(), "**BenchmarkX**: `go test -run '^$' -bench '^BenchmarkX$' -benchtime 1x ./x/` (measured 2026-02-01)")
	require.Contains(t, b.String(), `| 1a | a \| b | 1.00 ms |`)

	page := "prose before\n" + BeginMarker + "\nold table\n" + EndMarker + "\nprose after\n"
	out, err := ReplaceBetweenMarkers(page, b.String())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "prose before\n"+BeginMarker+"\n**BenchmarkX**"), out)
	require.True(t, strings.HasSuffix(out, "|\n"+EndMarker+"\nprose after\n"), out)
	require.NotContains(t, out, "old table")

	_, err = ReplaceBetweenMarkers("no markers", "x")
	require.ErrorContains(t, err, BeginMarker)
}
