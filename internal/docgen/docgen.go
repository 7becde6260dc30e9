// Package docgen writes the parts of Baton's reference pages that the code
// already says, so that they cannot drift from it: the commands and every
// setting, from the binary's own flag definitions, and the metrics, from
// the code's metric declarations. A page keeps its prose; only the text
// between its generated markers is written (`make docs`), and a test fails
// when the checked-in text differs from what the code says.
package docgen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/batonhq/baton/internal/cli"
)

// Page is a reference page with a generated region.
type Page struct {
	// Path is the page, relative to the repository's root.
	Path string
	// Region names the generated region: its text lies between
	// "<!-- BEGIN GENERATED: region -->" and "<!-- END GENERATED: region -->".
	Region string
	// Generate returns the region's text, given the repository's root.
	Generate func(root string) (string, error)
}

// Pages are the pages `make docs` writes.
var Pages = []Page{
	{Path: "docs/reference/cli.md", Region: "commands", Generate: func(string) (string, error) { return CLI(cli.Reference()), nil }},
	{Path: "docs/reference/metrics.md", Region: "metrics", Generate: func(root string) (string, error) {
		ms, err := Metrics(root)
		if err != nil {
			return "", err
		}
		return MetricsTable(ms), nil
	}},
}

// Command is the command that regenerates every page, as the test that
// finds a page stale tells its reader.
const Command = "make docs"

func begin(region string) string {
	return "<!-- BEGIN GENERATED: " + region + " (`" + Command + "` writes it; do not edit) -->"
}
func end(region string) string { return "<!-- END GENERATED: " + region + " -->" }

// Render returns the page as it should be: its file with the generated
// region replaced by what the code says now.
func (p Page) Render(root string) ([]byte, error) {
	old, err := os.ReadFile(filepath.Join(root, p.Path))
	if err != nil {
		return nil, err
	}
	text, err := p.Generate(root)
	if err != nil {
		return nil, err
	}
	return Splice(old, p.Region, text)
}

// Splice replaces the text between region's markers in page with text.
func Splice(page []byte, region, text string) ([]byte, error) {
	b := []byte(begin(region))
	e := []byte(end(region))
	i := bytes.Index(page, b)
	j := bytes.Index(page, e)
	if i < 0 || j < i {
		return nil, fmt.Errorf("the page has no generated region %q: put a line %q and, below it, a line %q where it goes", region, b, e)
	}
	var out bytes.Buffer
	out.Write(page[:i+len(b)])
	out.WriteString("\n\n")
	out.WriteString(strings.TrimSpace(text))
	out.WriteString("\n\n")
	out.Write(page[j:])
	return out.Bytes(), nil
}

// cell makes text safe inside a Markdown table cell: pipes are escaped,
// and angle brackets, which GitHub would take for HTML, are written as
// entities.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "<", "&lt;")
	s = strings.ReplaceAll(s, ">", "&gt;")
	return s
}

// code writes s as inline code, which GitHub shows as it is.
func code(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return "`" + s + "`"
}

// CLI renders the commands and their flags.
func CLI(cmds []cli.Command) string {
	var b strings.Builder
	b.WriteString("### Commands\n\n| command | what it does |\n| --- | --- |\n")
	for _, c := range cmds[1:] {
		fmt.Fprintf(&b, "| [%s](#%s) | %s |\n", code("baton "+c.Path), anchor("baton "+c.Path), cell(c.Help))
	}
	for _, c := range cmds {
		title := "baton " + c.Path
		if c.Path == "" {
			title = "Flags of every command"
		}
		fmt.Fprintf(&b, "\n### %s\n\n%s: %s\n", title, code(c.Usage), cell(c.Help))
		if len(c.Flags) == 0 {
			b.WriteString("\nNo flags besides those of every command.\n")
			continue
		}
		b.WriteString("\n| flag | variable | default | what |\n| --- | --- | --- | --- |\n")
		for _, f := range c.Flags {
			flag := "--" + f.Name
			if f.Placeholder != "" {
				flag += "=" + f.Placeholder
			}
			var vars []string
			for _, e := range f.Envs {
				vars = append(vars, code(e))
				if f.Secret {
					vars = append(vars, code(e+"_FILE"))
				}
			}
			v := strings.Join(vars, ", ")
			if v == "" {
				v = "none"
			}
			def := "none"
			if f.Default != "" {
				def = code(f.Default)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", code(flag), v, def, cell(f.Help))
		}
	}
	return b.String()
}

// anchor is the fragment GitHub gives a heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
