// Command benchtable prints the figures a `make bench` run recorded (the
// file named by BATON_BENCH_REPORT) as one table: each figure, its value,
// the reference measured in the same run, their ratio, the aim, whether it
// was met, and its change since the previous report.
//
// With -previous it compares with an earlier report (kept in the
// repository, docs/internals/measured.jsonl); with -doc it writes the
// tables into a page between its markers (<!-- bench:begin --> and
// <!-- bench:end -->), the rest of the page untouched; with -save it
// writes this run's figures, and the earlier ones of benchmarks that did
// not run, to the -previous file, for the next run to compare with. It
// knows no benchmark by name: whatever a benchmark recorded with
// bench.Record shows up.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/batonhq/baton/internal/bench"
)

func main() {
	markdown := flag.Bool("markdown", false, "print Markdown tables, as -doc writes them")
	previous := flag.String("previous", "", "an earlier report to compare with (JSON lines); a missing file is an empty report")
	doc := flag.String("doc", "", "a page whose tables, between its markers, are replaced with this run's")
	save := flag.Bool("save", false, "write this run's figures, with the earlier ones of benchmarks that did not run, to the -previous file")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchtable [-markdown] [-previous FILE [-save]] [-doc PAGE] REPORT")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *save && *previous == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *previous, *doc, *markdown, *save); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func readReport(path string) ([]bench.Figure, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return bench.ReadReport(f)
}

func run(path, previous, doc string, markdown, save bool) error {
	cur, err := readReport(path)
	if err != nil {
		return err
	}
	if len(cur) == 0 {
		return fmt.Errorf("%s holds no figures: did the benchmarks run?", path)
	}
	var prev []bench.Figure
	if previous != "" {
		if prev, err = readReport(previous); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	before := bench.ByKey(prev)
	all := bench.Merge(prev, cur, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if markdown {
		err = bench.WriteMarkdown(os.Stdout, all, before)
	} else {
		err = bench.WriteTable(os.Stdout, all, before)
	}
	if err != nil {
		return err
	}
	if doc != "" {
		page, err := os.ReadFile(doc)
		if err != nil {
			return err
		}
		var tables bytes.Buffer
		if err := bench.WriteMarkdown(&tables, all, before); err != nil {
			return err
		}
		out, err := bench.ReplaceBetweenMarkers(string(page), tables.String())
		if err != nil {
			return fmt.Errorf("%s: %w", doc, err)
		}
		if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
			return err
		}
	}
	if save {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		for _, f := range all {
			if err := enc.Encode(f); err != nil {
				return err
			}
		}
		if err := os.WriteFile(previous, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}
