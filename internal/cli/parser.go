package cli

import (
	"sync"

	"github.com/alecthomas/kong"
)

// parser is a kong parser of the command line with the root it parses
// into. kong.New builds the whole grammar, and interpolates every variable
// into the default, help and variables of each of its hundreds of flags:
// tens of milliseconds, half a second under the race detector, for every
// Run. A parser is built once instead and kept for the next Run, used by
// one Run at a time: a parse writes into the root and into the grammar
// (the flags set, the commands reached, which later parses read), so
// Run restores both to what kong.New left before each parse, and a parse
// sees nothing of the ones before it.
type parser struct {
	kong *kong.Kong
	root *root
	// restore puts back the root and every node, flag and value of the
	// grammar as they were when the parser was built.
	restore []func()
}

// parsers are the parsers no Run is using: one per Run that ran at the
// same time as another, at most.
var parsers struct {
	sync.Mutex
	free []*parser
}

// takeParser returns a parser for one Run, reset to the state kong.New
// left it in, and built anew when every parser is in use.
func takeParser() (*parser, error) {
	parsers.Lock()
	var p *parser
	if n := len(parsers.free); n > 0 {
		p, parsers.free = parsers.free[n-1], parsers.free[:n-1]
	}
	parsers.Unlock()
	if p == nil {
		return newParser()
	}
	for _, restore := range p.restore {
		restore()
	}
	return p, nil
}

// releaseParser keeps p for a later Run, once the Run that used it, and
// with it everything that read the root's flags, has returned.
func releaseParser(p *parser) {
	parsers.Lock()
	defer parsers.Unlock()
	parsers.free = append(parsers.free, p)
}

func newParser() (*parser, error) {
	r := &root{}
	k, err := kong.New(r,
		kong.Name("baton"),
		kong.Description("Baton: a durable backend for AI-agent conversations."),
		kong.Vars(vars()),
		kong.UsageOnError(),
		kong.Exit(func(code int) { panic(exitSentinel{code}) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Resolvers(secretFiles()),
	)
	if err != nil {
		return nil, err
	}
	p := &parser{kong: k, root: r}
	p.restore = append(p.restore, keep(r), keep(k), keep(k.Model))
	if f := k.Model.HelpFlag; f != nil {
		p.restore = append(p.restore, keep(f), keep(f.Value))
	}
	var visit func(n *kong.Node)
	visit = func(n *kong.Node) {
		p.restore = append(p.restore, keep(n))
		if n.Argument != nil {
			p.restore = append(p.restore, keep(n.Argument))
		}
		for _, f := range n.Flags {
			p.restore = append(p.restore, keep(f), keep(f.Value))
		}
		for _, v := range n.Positional {
			p.restore = append(p.restore, keep(v))
		}
		for _, c := range n.Children {
			visit(c)
		}
	}
	visit(k.Model.Node)
	return p, nil
}

// keep returns a function that puts *v back as it is now.
func keep[T any](v *T) func() {
	saved := *v
	return func() { *v = saved }
}
