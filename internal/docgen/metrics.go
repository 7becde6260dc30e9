package docgen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Metric is one metric the code declares.
type Metric struct {
	Name string
	// Type is counter, gauge, histogram or summary.
	Type string
	// Labels are its label names, constant ones included.
	Labels []string
	Help   string
	// Package is the folder of the Go package that declares it, relative
	// to the repository's root.
	Package string
}

// constructors are client_golang's functions that declare a metric from
// an options struct, by the type of metric they make.
var constructors = map[string]string{
	"NewCounter": "counter", "NewCounterVec": "counter", "NewCounterFunc": "counter",
	"NewGauge": "gauge", "NewGaugeVec": "gauge", "NewGaugeFunc": "gauge",
	"NewHistogram": "histogram", "NewHistogramVec": "histogram",
	"NewSummary": "summary", "NewSummaryVec": "summary",
	"NewUntypedFunc": "untyped",
}

// Metrics reads every metric declared in the non-test Go files under
// root: each call of a client_golang constructor (prometheus.NewCounter,
// NewGaugeVec, NewDesc, ...). A declaration whose name is not a constant
// string is an error, so that no metric escapes the reference.
func Metrics(root string) ([]Metric, error) {
	var out []Metric
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		pkg, _ := filepath.Rel(root, filepath.Dir(path))
		prom := importName(f, "github.com/prometheus/client_golang/prometheus")
		if prom == "" {
			return nil
		}
		var inspectErr error
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || inspectErr != nil {
				return inspectErr == nil
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != prom {
				return true
			}
			m, found, err := declared(sel.Sel.Name, call)
			if err != nil {
				inspectErr = fmt.Errorf("%s: %w", fset.Position(call.Pos()), err)
				return false
			}
			if found {
				m.Package = filepath.ToSlash(pkg)
				out = append(out, m)
			}
			return true
		})
		return inspectErr
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	out = slices.CompactFunc(out, func(a, b Metric) bool { return a.Name == b.Name && a.Package == b.Package })
	return out, nil
}

// declared reads the metric a constructor call declares.
func declared(fn string, call *ast.CallExpr) (Metric, bool, error) {
	if fn == "NewDesc" {
		if len(call.Args) < 3 {
			return Metric{}, false, nil
		}
		name, ok := stringValue(call.Args[0])
		if !ok {
			return Metric{}, false, fmt.Errorf("prometheus.NewDesc with a name that is not a constant string: the metrics reference cannot name it")
		}
		help, _ := stringValue(call.Args[1])
		return Metric{Name: name, Type: "collected", Help: help, Labels: stringList(call.Args[2])}, true, nil
	}
	typ, ok := constructors[fn]
	if !ok || len(call.Args) == 0 {
		return Metric{}, false, nil
	}
	lit, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return Metric{}, false, fmt.Errorf("prometheus.%s with options that are not a literal: the metrics reference cannot read its name", fn)
	}
	m := Metric{Type: typ}
	for _, e := range lit.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil {
			continue
		}
		switch key.Name {
		case "Name":
			if m.Name, ok = stringValue(kv.Value); !ok {
				return Metric{}, false, fmt.Errorf("prometheus.%s with a Name that is not a constant string: the metrics reference cannot name it", fn)
			}
		case "Namespace", "Subsystem":
			return Metric{}, false, fmt.Errorf("prometheus.%s with a %s: write the whole name in Name, so that it can be searched for", fn, key.Name)
		case "Help":
			m.Help, _ = stringValue(kv.Value)
		case "ConstLabels":
			if cl, ok := kv.Value.(*ast.CompositeLit); ok {
				for _, e := range cl.Elts {
					if kv, ok := e.(*ast.KeyValueExpr); ok {
						if k, ok := stringValue(kv.Key); ok {
							m.Labels = append(m.Labels, k)
						}
					}
				}
			}
		}
	}
	if m.Name == "" {
		return Metric{}, false, fmt.Errorf("prometheus.%s without a Name", fn)
	}
	if strings.HasSuffix(fn, "Vec") && len(call.Args) > 1 {
		m.Labels = append(m.Labels, stringList(call.Args[1])...)
	}
	return m, true, nil
}

// stringValue evaluates a constant string expression: a literal, or
// literals joined with +.
func stringValue(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok1 := stringValue(e.X)
		b, ok2 := stringValue(e.Y)
		return a + b, ok1 && ok2
	case *ast.ParenExpr:
		return stringValue(e.X)
	}
	return "", false
}

// stringList reads a []string{...} literal.
func stringList(e ast.Expr) []string {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	var out []string
	for _, x := range lit.Elts {
		if s, ok := stringValue(x); ok {
			out = append(out, s)
		}
	}
	return out
}

// importName is the name a file uses for the package at path, or "".
func importName(f *ast.File, path string) string {
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); p == path {
			if im.Name != nil {
				return im.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}

// MetricsTable renders the metrics as a table.
func MetricsTable(ms []Metric) string {
	var b strings.Builder
	b.WriteString("| metric | type | labels | declared in | what it measures |\n| --- | --- | --- | --- | --- |\n")
	for _, m := range ms {
		labels := "none"
		if len(m.Labels) > 0 {
			var ls []string
			for _, l := range m.Labels {
				ls = append(ls, code(l))
			}
			labels = strings.Join(ls, ", ")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", code(m.Name), m.Type, labels, code(m.Package), cell(m.Help))
	}
	return b.String()
}
