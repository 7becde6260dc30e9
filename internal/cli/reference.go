package cli

import (
	"regexp"
	"strings"

	"github.com/alecthomas/kong"
)

// Command is one command of the binary as its grammar defines it: what
// the generated reference (docs/reference/cli.md) shows, so that the page
// says what --help says.
type Command struct {
	// Path is the command's words after `baton` ("token create"); empty
	// for the flags every command accepts.
	Path string
	// Usage is the command line as --help shows it ("baton token revoke
	// <id> [flags]").
	Usage string
	// Help is the command's one-line help.
	Help string
	// Flags are the flags the command accepts besides those every command
	// does, its parent commands' included.
	Flags []FlagInfo
}

// FlagInfo is one flag of a command.
type FlagInfo struct {
	Name string
	// Envs are the BATON_* variables that set it.
	Envs []string
	// Default is the value the flag means when it is not given: its
	// default, or the library default its help names ("Defaults to X."),
	// or "" for none.
	Default string
	Help    string
	// Placeholder is the value's name in usage text (URL, FILE, ...).
	Placeholder string
	// Bool is a flag without a value (--dry-run).
	Bool bool
	// Secret flags may also come from a file named by <VAR>_FILE.
	Secret bool
}

// defaultInHelp finds the default a flag's help names, for flags whose
// default is the library's (no default in the flag tag).
var defaultInHelp = regexp.MustCompile(`Defaults? (?:to |: ?)(.+?)\.(?:\s|$)`)

// Reference returns every command of the binary, the flags common to all
// first, in the order of the grammar.
func Reference() []Command {
	var r root
	parser, err := kong.New(&r, kong.Name("baton"), kong.Vars(vars()))
	if err != nil {
		panic("cli: the command line grammar does not build: " + err.Error())
	}
	app := parser.Model.Node
	out := []Command{{Usage: "baton [command] [flags]", Help: "Flags every command accepts.", Flags: flagInfos(app.Flags)}}
	var visit func(n *kong.Node)
	visit = func(n *kong.Node) {
		if n.Hidden {
			return
		}
		if n.Type == kong.CommandNode {
			var flags []*kong.Flag
			for p := n; p != nil && p.Type == kong.CommandNode; p = p.Parent {
				flags = append(append([]*kong.Flag{}, p.Flags...), flags...)
			}
			out = append(out, Command{
				Path:  commandPath(n),
				Usage: "baton " + n.Summary(),
				Help:  n.Help,
				Flags: flagInfos(flags),
			})
		}
		for _, c := range n.Children {
			visit(c)
		}
	}
	for _, c := range app.Children {
		visit(c)
	}
	return out
}

func flagInfos(flags []*kong.Flag) []FlagInfo {
	var out []FlagInfo
	for _, f := range flags {
		if f.Hidden {
			continue
		}
		fi := FlagInfo{
			Name: f.Name, Envs: f.Envs, Help: f.Help, Placeholder: f.PlaceHolder,
			Bool: f.IsBool(), Secret: secretFlags[f.Name],
		}
		switch {
		case f.HasDefault:
			fi.Default = f.Default
		case defaultInHelp.MatchString(f.Help):
			fi.Default = defaultInHelp.FindStringSubmatch(f.Help)[1]
		case fi.Bool:
			fi.Default = "false"
		}
		fi.Help = strings.TrimSpace(fi.Help)
		out = append(out, fi)
	}
	return out
}
