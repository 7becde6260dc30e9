// Package docs_test keeps Baton's documentation true: the generated
// reference pages say what the code says, every relative link resolves,
// every package is in the codemap and checks for leaked goroutines, and
// the README's tour runs as written.
package docs_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/docgen"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// root is the repository's root, the parent of this folder.
func root(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("..")
	require.NoError(t, err)
	return abs
}

func TestTheGeneratedReferencePagesSayWhatTheCodeSays(t *testing.T) {
	t.Parallel()
	r := root(t)
	for _, p := range docgen.Pages {
		want, err := p.Render(r)
		require.NoError(t, err, "%s: the generated region cannot be written", p.Path)
		got, err := os.ReadFile(filepath.Join(r, p.Path))
		require.NoError(t, err)
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the code says (%s): run `%s` and commit the page", p.Path, firstDifference(got, want), docgen.Command)
		}
	}
}

// firstDifference names the first line where two texts differ.
func firstDifference(got, want []byte) string {
	g := strings.Split(string(got), "\n")
	w := strings.Split(string(want), "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d is %q, the code says %q", i+1, gl, wl)
		}
	}
	return "they differ"
}

// metricLike finds names in the docs that read as Baton's metrics.
var metricLike = regexp.MustCompile(`\bbaton_[a-z0-9_]+(_total|_seconds|_bytes|_events|_seq|_lsn|_streams|_turns|_connected|_active|_letters|_in_flight|_messages|_attempts)\b`)

func TestEveryMetricTheDocsNameIsOneTheCodeDeclares(t *testing.T) {
	t.Parallel()
	r := root(t)
	ms, err := docgen.Metrics(r)
	require.NoError(t, err)
	declared := map[string]bool{}
	for _, m := range ms {
		declared[m.Name] = true
	}
	require.NotEmpty(t, declared, "no metric found in the code: the parser of metric declarations is broken")
	for _, page := range markdownPages(t, r) {
		text, err := os.ReadFile(filepath.Join(r, page))
		require.NoError(t, err)
		for i, line := range strings.Split(string(text), "\n") {
			for _, name := range metricLike.FindAllString(line, -1) {
				if !declared[name] {
					t.Errorf("%s:%d names the metric %s, which no code declares (docs/reference/metrics.md lists those that exist)", page, i+1, name)
				}
			}
		}
	}
}

// markdownPages are README.md and every page under docs/, relative to
// the root.
func markdownPages(t *testing.T, r string) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(r, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(r, path)
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return pages
}

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// linksOf returns the links of a Markdown page outside code, with their
// line numbers, and the anchors its headings make.
func linksOf(text string) (links map[int][]string, anchors map[string]bool) {
	links = map[int][]string{}
	anchors = map[string]bool{}
	seen := map[string]int{}
	inCode := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			a := slug(m[1])
			if k := seen[a]; k > 0 {
				anchors[a+"-"+strconv.Itoa(k)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		// Inline code is no link.
		plain := regexp.MustCompile("`[^`]*`").ReplaceAllStringFunc(line, func(s string) string {
			if strings.Contains(s, "](") {
				return ""
			}
			return s
		})
		for _, m := range linkRE.FindAllStringSubmatch(plain, -1) {
			links[n] = append(links[n], m[1])
		}
	}
	return links, anchors
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped, spaces as hyphens.
func slug(heading string) string {
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestEveryRelativeLinkInTheDocsResolves(t *testing.T) {
	t.Parallel()
	r := root(t)
	pages := markdownPages(t, r)
	anchorsOf := map[string]map[string]bool{}
	linksIn := map[string]map[int][]string{}
	for _, p := range pages {
		text, err := os.ReadFile(filepath.Join(r, p))
		require.NoError(t, err)
		linksIn[p], anchorsOf[p] = linksOf(string(text))
	}
	var missingPages, problems []string
	for _, p := range pages {
		lines := slices.Sorted(mapsKeys(linksIn[p]))
		for _, n := range lines {
			for _, link := range linksIn[p][n] {
				if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
					continue
				}
				target, frag, _ := strings.Cut(link, "#")
				where := fmt.Sprintf("%s:%d", p, n)
				targetPath := p
				if target != "" {
					targetPath = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p), target)))
					if strings.HasPrefix(targetPath, "../") {
						problems = append(problems, fmt.Sprintf("%s: %s leaves the repository", where, link))
						continue
					}
					if _, err := os.Stat(filepath.Join(r, targetPath)); err != nil {
						missingPages = append(missingPages, fmt.Sprintf("missing page: %s (linked from %s)", targetPath, where))
						continue
					}
				}
				if frag == "" {
					continue
				}
				anchors, ok := anchorsOf[targetPath]
				if !ok {
					continue // an anchor into a file that is not a page of the docs (a line of code)
				}
				if !anchors[frag] {
					problems = append(problems, fmt.Sprintf("%s: %s has no heading for #%s", where, targetPath, frag))
				}
			}
		}
	}
	for _, m := range missingPages {
		t.Error(m)
	}
	for _, m := range problems {
		t.Error(m)
	}
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// goPackage is what `go list` says of a package.
type goPackage struct {
	ImportPath   string
	Dir          string
	Name         string
	Imports      []string
	TestGoFiles  []string
	XTestGoFiles []string
}

// packages lists the module's packages as `go list ./...` does.
func packages(t *testing.T, r string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = r
	out, err := cmd.Output()
	require.NoError(t, err, "go list ./...")
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		require.NoError(t, dec.Decode(&p))
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

const module = "github.com/batonhq/baton"

// codemapRow is a row of the codemap's package table: the package's
// folder as code, what it owns, what it may import.
var (
	codemapRow = regexp.MustCompile("^\\| `([a-z0-9_./-]+)` \\| (.*?) \\| (.*?) \\|")
	codeSpan   = regexp.MustCompile("`([^`]+)`")
)

func TestEveryPackageIsInTheCodemapAndImportsOnlyWhatItsRowAllows(t *testing.T) {
	t.Parallel()
	r := root(t)
	text, err := os.ReadFile(filepath.Join(r, "docs", "architecture.md"))
	require.NoError(t, err)
	mayImport := map[string]map[string]bool{}
	for _, line := range strings.Split(string(text), "\n") {
		m := codemapRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		allowed := map[string]bool{}
		for _, c := range codeSpan.FindAllStringSubmatch(m[3], -1) {
			allowed[c[1]] = true
		}
		mayImport[m[1]] = allowed
	}
	exists := map[string]bool{}
	for _, p := range packages(t, r) {
		rel := relPackage(p.ImportPath)
		exists[rel] = true
		allowed, ok := mayImport[rel]
		if !ok {
			t.Errorf("package %s is not in docs/architecture.md: add a row \"| `%s` | what it owns | what it may import | what it must never do |\" to its table", rel, rel)
			continue
		}
		for _, im := range p.Imports {
			if !strings.HasPrefix(im, module+"/") {
				continue
			}
			if dep := relPackage(im); !allowed[dep] {
				t.Errorf("package %s imports %s, which its row in docs/architecture.md does not allow: add it to the row's \"may import\" if that is right, or remove the import", rel, dep)
			}
		}
	}
	for p := range mayImport {
		if !exists[p] {
			t.Errorf("docs/architecture.md has a row for %s, which `go list ./...` does not list: remove it or fix its name", p)
		}
	}
}

// relPackage is a package's folder in the repository.
func relPackage(importPath string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(importPath, module), "/")
	if rel == "" {
		return "."
	}
	return rel
}

func TestEveryPackageWithTestsChecksForLeakedGoroutines(t *testing.T) {
	t.Parallel()
	r := root(t)
	for _, p := range packages(t, r) {
		files := append(append([]string{}, p.TestGoFiles...), p.XTestGoFiles...)
		if len(files) == 0 {
			continue
		}
		if !callsTestenvMain(t, p.Dir, files) {
			t.Errorf("%s has tests but no TestMain that runs them through testenv.Main (the goroutine-leak check): add func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }", p.ImportPath)
		}
	}
}

// callsTestenvMain reports whether one of files declares TestMain and
// calls testenv.Main in it.
func callsTestenvMain(t *testing.T, dir string, files []string) bool {
	t.Helper()
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		require.NoError(t, err)
		local := ""
		for _, im := range f.Imports {
			if p, _ := strconv.Unquote(im.Path.Value); p == module+"/internal/testenv" {
				local = "testenv"
				if im.Name != nil {
					local = im.Name.Name
				}
			}
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "TestMain" || fn.Recv != nil || fn.Body == nil {
				continue
			}
			found := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Main" {
					if x, ok := sel.X.(*ast.Ident); ok && local != "" && x.Name == local {
						found = true
					}
				}
				return !found
			})
			if found {
				return true
			}
		}
	}
	return false
}
