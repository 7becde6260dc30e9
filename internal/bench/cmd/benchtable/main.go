// Command benchtable prints the figures a `make bench` run recorded (the
// file named by BATON_BENCH_REPORT) as one table: each figure, its value,
// the reference measured in the same run, their ratio, the aim and whether
// it was met. With -markdown it prints the table as docs/internals/measured.md shows it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/batonhq/baton/internal/bench"
)

func main() {
	markdown := flag.Bool("markdown", false, "print a Markdown table")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: benchtable [-markdown] REPORT")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *markdown); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(path string, markdown bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	figs, err := bench.ReadReport(f)
	if err != nil {
		return err
	}
	if len(figs) == 0 {
		return fmt.Errorf("%s holds no figures: did the benchmarks run?", path)
	}
	if markdown {
		return bench.WriteMarkdown(os.Stdout, figs)
	}
	return bench.WriteTable(os.Stdout, figs)
}
