package bench

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The report kept across runs: `make bench` compares each figure with the
// one before it and keeps the figures of benchmarks that did not run.

// SortFigures puts figs in table order: by ID, numbers as numbers ("2a"
// before "10a"), IDs without a letter prefix first.
func SortFigures(figs []Figure) {
	slices.SortStableFunc(figs, func(a, b Figure) int {
		pa, na, ra := splitID(a.ID)
		pb, nb, rb := splitID(b.ID)
		if c := strings.Compare(pa, pb); c != 0 {
			return c
		}
		if na != nb {
			return na - nb
		}
		return strings.Compare(ra, rb)
	})
}

// splitID splits "F12b" into "F", 12, "b".
func splitID(id string) (prefix string, n int, rest string) {
	i := strings.IndexFunc(id, func(r rune) bool { return r >= '0' && r <= '9' })
	if i < 0 {
		return id, 0, ""
	}
	j := i
	for j < len(id) && id[j] >= '0' && id[j] <= '9' {
		j++
	}
	n, _ = strconv.Atoi(id[i:j])
	return id[:i], n, id[j:]
}

// Merge returns the figures of this run (cur, each marked with run) and
// those of the previous report of benchmarks that did not run this time,
// in table order: a run of one benchmark updates its own figures only.
func Merge(prev, cur []Figure, run string) []Figure {
	ran := map[string]bool{}
	var out []Figure
	for _, f := range cur {
		ran[f.Bench] = true
		f.Run = run
		out = append(out, f)
	}
	for _, f := range prev {
		if !ran[f.Bench] {
			f.kept = true
			out = append(out, f)
		}
	}
	SortFigures(out)
	return out
}

var leadingNumber = regexp.MustCompile(`^\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*([^\s(/]*)`)

// number reads the number a figure's value starts with, and its unit.
func number(value string) (float64, string, bool) {
	m := leadingNumber.FindStringSubmatch(value)
	if m == nil {
		return 0, "", false
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
	return v, m[2], err == nil
}

// Change says how f moved since the same figure in prev: its value in
// percent (when both are numbers of one unit) and its ratio. "new" for a
// figure prev lacks; "-" when nothing comparable changed.
func Change(f Figure, prev map[string]Figure) string {
	p, ok := prev[f.key()]
	if !ok {
		if len(prev) == 0 {
			return "-"
		}
		return "new"
	}
	if f.kept {
		return "not run this time"
	}
	var parts []string
	v, unit, ok1 := number(f.Value)
	pv, punit, ok2 := number(p.Value)
	if ok1 && ok2 && unit == punit && pv != 0 {
		parts = append(parts, fmt.Sprintf("%+.0f%%", (v-pv)/pv*100))
	}
	if f.Ratio != 0 && p.Ratio != 0 {
		parts = append(parts, fmt.Sprintf("ratio %.2f→%.2f", p.Ratio, f.Ratio))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// ByKey indexes figs for Change.
func ByKey(figs []Figure) map[string]Figure {
	m := make(map[string]Figure, len(figs))
	for _, f := range figs {
		m[f.key()] = f
	}
	return m
}

var tableHeader = []string{"#", "figure", "value", "reference (same run)", "ratio", "aim", "met", "change"}

func (f Figure) cells(prev map[string]Figure) []string {
	return []string{f.ID, f.Name, f.Value, orDash(f.Reference), ratioText(f.Ratio), orDash(f.Aim), orDash(f.Met), Change(f, prev)}
}

// WriteTable prints figs as a table with aligned columns, each figure's
// change since prev (a report of an earlier run, or nil) in the last.
func WriteTable(w io.Writer, figs []Figure, prev map[string]Figure) error {
	rows := [][]string{tableHeader}
	for _, f := range figs {
		rows = append(rows, f.cells(prev))
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

// WriteMarkdown prints figs as docs/internals/measured.md shows them: a
// table per benchmark, under the command that measures it again and the
// date of its run, each figure's change since prev in the last column.
func WriteMarkdown(w io.Writer, figs []Figure, prev map[string]Figure) error {
	var b strings.Builder
	var groups []string
	byBench := map[string][]Figure{}
	for _, f := range figs {
		if _, ok := byBench[f.Bench]; !ok {
			groups = append(groups, f.Bench)
		}
		byBench[f.Bench] = append(byBench[f.Bench], f)
	}
	for n, g := range groups {
		fs := byBench[g]
		if n > 0 {
			b.WriteString("\n")
		}
		name := g
		if name == "" {
			name = "unnamed benchmark"
		}
		fmt.Fprintf(&b, "**%s**", name)
		if cmd := fs[0].Command(); cmd != "" {
			fmt.Fprintf(&b, ": `%s`", cmd)
		}
		if fs[0].Run != "" {
			fmt.Fprintf(&b, " (measured %s)", fs[0].Run)
		}
		b.WriteString("\n\n")
		b.WriteString("| " + strings.Join(tableHeader, " | ") + " |\n")
		b.WriteString(strings.Repeat("| --- ", len(tableHeader)) + "|\n")
		for _, f := range fs {
			cells := f.cells(prev)
			for i, c := range cells {
				cells[i] = strings.ReplaceAll(c, "|", `\|`)
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Markers around the generated part of a page.
const (
	BeginMarker = "<!-- bench:begin -->"
	EndMarker   = "<!-- bench:end -->"
)

// ReplaceBetweenMarkers returns page with what lies between BeginMarker
// and EndMarker replaced by generated, the rest of the page as it was.
func ReplaceBetweenMarkers(page, generated string) (string, error) {
	i := strings.Index(page, BeginMarker)
	j := strings.Index(page, EndMarker)
	if i < 0 || j < i {
		return "", fmt.Errorf("bench: the page lacks the lines %s and %s, in that order, around its tables", BeginMarker, EndMarker)
	}
	return page[:i+len(BeginMarker)] + "\n" + generated + page[j:], nil
}
