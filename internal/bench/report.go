// Package bench runs Baton's benchmarks the way Baton runs: real baton
// processes (the binary of this tree, or of an earlier commit for a
// reference), a durable PostgreSQL cluster and NATS servers. Each benchmark
// measures its figures and their references in the same run and records
// them; `make bench` prints every recorded figure as one table (see
// cmd/benchtable). Benchmarks report; they assert only correctness.
package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
)

// ReportEnv names the file that Record appends figures to, one JSON object
// a line. `make bench` sets it and prints the file as a table at the end.
const ReportEnv = "BATON_BENCH_REPORT"

// Figure is one measured figure next to its reference.
type Figure struct {
	// ID orders the table: the figure number and a letter, such
	// as "2a".
	ID string `json:"id"`
	// Name says what was measured, and how.
	Name string `json:"name"`
	// Value is the figure, with its unit.
	Value string `json:"value"`
	// Reference is what Value is compared with, measured in the same run;
	// empty when there is none.
	Reference string `json:"reference,omitempty"`
	// Ratio is Value over Reference; 0 when there is no reference.
	Ratio float64 `json:"ratio,omitempty"`
	// Aim is what the figure should reach; empty when there is no aim.
	Aim string `json:"aim,omitempty"`
	// Met says whether the aim was reached: "yes", "no", or empty without
	// an aim.
	Met string `json:"met,omitempty"`
}

// Verdict is "yes" when ok, else "no": a Figure's Met.
func Verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

var reportMu sync.Mutex

// Record logs f and appends it to the report named by ReportEnv, if any.
func Record(tb testing.TB, f Figure) {
	tb.Helper()
	tb.Logf("figure %s: %s: %s (reference %s, ratio %s, aim %s, met %s)", f.ID, f.Name, f.Value,
		orDash(f.Reference), ratioText(f.Ratio), orDash(f.Aim), orDash(f.Met))
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	b, err := json.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatalf("bench: open the report %s: %v", path, err)
	}
	defer file.Close()
	if _, err := file.Write(append(b, '\n')); err != nil {
		tb.Fatalf("bench: write the report %s: %v", path, err)
	}
}

// ReadReport reads the figures a run recorded, in table order.
func ReadReport(r io.Reader) ([]Figure, error) {
	var figs []Figure
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var f Figure
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			return nil, fmt.Errorf("bench: report line %q: %w", line, err)
		}
		figs = append(figs, f)
	}
	sort.SliceStable(figs, func(i, j int) bool { return figs[i].ID < figs[j].ID })
	return figs, sc.Err()
}

var tableHeader = []string{"#", "figure", "value", "reference", "ratio", "aim", "met"}

func (f Figure) cells() []string {
	return []string{f.ID, f.Name, f.Value, orDash(f.Reference), ratioText(f.Ratio), orDash(f.Aim), orDash(f.Met)}
}

// WriteTable prints figs as a table with aligned columns.
func WriteTable(w io.Writer, figs []Figure) error {
	rows := [][]string{tableHeader}
	for _, f := range figs {
		rows = append(rows, f.cells())
	}
	widths := make([]int, len(tableHeader))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for n, r := range rows {
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-len([]rune(c))))
			}
		}
		b.WriteString("\n")
		if n == 0 {
			for i := range widths {
				if i > 0 {
					b.WriteString("  ")
				}
				b.WriteString(strings.Repeat("-", widths[i]))
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteMarkdown prints figs as a Markdown table, as docs/internals/measured.md shows them.
func WriteMarkdown(w io.Writer, figs []Figure) error {
	var b strings.Builder
	b.WriteString("| " + strings.Join(tableHeader, " | ") + " |\n")
	b.WriteString(strings.Repeat("| --- ", len(tableHeader)) + "|\n")
	for _, f := range figs {
		cells := f.cells()
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ratioText(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}
