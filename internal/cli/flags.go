package cli

import (
	"strings"

	"github.com/alecthomas/kong"
)

// Flag is one flag of a command as the binary parses it: its name (without
// the dashes) and the BATON_* variables that set it.
type Flag struct {
	Name string
	Envs []string
}

// Flags returns the flags every command accepts, its parents' included,
// keyed by the command as typed after `baton` ("api", "group run",
// "token create"). A command with a default subcommand ("migrate") is
// listed under its own name too, with its default's flags. Deployment
// files are checked against it, so that a flag or a variable they set is
// one the binary reads.
func Flags() map[string][]Flag {
	var r root
	parser, err := kong.New(&r, kong.Name("baton"), kong.Vars(vars()))
	if err != nil {
		panic("cli: the command line grammar does not build: " + err.Error())
	}
	out := map[string][]Flag{}
	var visit func(n *kong.Node)
	visit = func(n *kong.Node) {
		if n.Type == kong.CommandNode {
			var flags []Flag
			for _, group := range n.AllFlags(false) {
				for _, f := range group {
					flags = append(flags, Flag{Name: f.Name, Envs: f.Envs})
				}
			}
			out[commandPath(n)] = flags
			if n.DefaultCmd != nil {
				defer func() { out[commandPath(n)] = out[commandPath(n.DefaultCmd)] }()
			}
		}
		for _, c := range n.Children {
			visit(c)
		}
	}
	visit(parser.Model.Node)
	return out
}

// commandPath is a command's words after `baton`, without arguments.
func commandPath(n *kong.Node) string {
	var words []string
	for ; n != nil; n = n.Parent {
		if n.Type == kong.CommandNode {
			words = append([]string{n.Name}, words...)
		}
	}
	return strings.Join(words, " ")
}
