package agent

import (
	"fmt"
	"slices"
	"sync"

	"github.com/batonhq/baton/consumer"
)

// Registry is the set of tools offered to the model. The same registry
// gives the agent the tools' schemas and the turn runner the tools it
// journals and runs (Tools). It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]*compiled
}

// NewRegistry returns a registry with tools registered, or panics if one
// of them is invalid: for tools fixed at compile time. Use Register for
// tools that may fail.
func NewRegistry(tools ...Tool) *Registry {
	r := &Registry{tools: map[string]*compiled{}}
	if err := r.Register(tools...); err != nil {
		panic(err)
	}
	return r
}

// Register adds tools. Each must have a unique name, a schema that
// compiles, an effect and a handler; on an error nothing is added.
func (r *Registry) Register(tools ...Tool) error {
	cs := make([]*compiled, 0, len(tools))
	seen := map[string]bool{}
	for _, t := range tools {
		c, err := compile(t)
		if err != nil {
			return err
		}
		if seen[t.Name] {
			return fmt.Errorf("%w %q: registered twice: give each tool its own name", ErrInvalidTool, t.Name)
		}
		seen[t.Name] = true
		cs = append(cs, c)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		if _, ok := r.tools[c.spec.Name]; ok {
			return fmt.Errorf("%w %q: a tool of that name is already registered: give each tool its own name", ErrInvalidTool, c.spec.Name)
		}
	}
	for _, c := range cs {
		r.tools[c.spec.Name] = c
	}
	return nil
}

// Names returns the registered tool names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tools))
	for n := range r.tools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Tools returns the registered tools for the turn runner's journal
// (consumer.Config.Tools): it looks a call up there by name, journals it
// with the tool's version and effect, and runs it.
func (r *Registry) Tools() consumer.Tools {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ts := consumer.Tools{}
	for _, c := range r.tools {
		ts.Register(c)
	}
	return ts
}

func (r *Registry) lookup(name string) (*compiled, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c, ok := r.tools[name]
	return c, ok
}

// Specs declare the registered tools, in name order.
func (r *Registry) Specs() []consumer.ToolSpec {
	var out []consumer.ToolSpec
	for _, n := range r.Names() {
		c, _ := r.lookup(n)
		out = append(out, c.Spec())
	}
	return out
}
