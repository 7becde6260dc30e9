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
	"path/filepath"
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
	// Bench and Package name the benchmark that measured the figure and
	// its package, such as "./relay/": Record fills them in.
	Bench   string `json:"bench,omitempty"`
	Package string `json:"package,omitempty"`
	// Run is the date of the run that measured the figure, in a report
	// kept across runs (see Merge).
	Run string `json:"run,omitempty"`
	// kept is set by Merge on a figure of an earlier run.
	kept bool
}

// Command is how to measure the figure again on its own.
func (f Figure) Command() string {
	if f.Bench == "" || f.Package == "" {
		return ""
	}
	return fmt.Sprintf("go test -run '^$' -bench '^%s$' -benchtime 1x %s", f.Bench, f.Package)
}

// key identifies a figure across runs: IDs are the benchmarks' own.
func (f Figure) key() string { return f.Bench + " " + f.ID }

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
	if f.Bench == "" {
		f.Bench, _, _ = strings.Cut(tb.Name(), "/")
	}
	if f.Package == "" {
		f.Package = packageDir()
	}
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
	SortFigures(figs)
	return figs, sc.Err()
}

// packageDir is the package of the running benchmark relative to the
// repository, such as "./relay/": `go test` runs a package's tests in its
// folder.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	rel, err := filepath.Rel(repoRoot(), wd)
	if err != nil || strings.HasPrefix(rel, "..") {
		return ""
	}
	return "./" + filepath.ToSlash(rel) + "/"
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
