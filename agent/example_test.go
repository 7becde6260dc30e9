package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/batonhq/baton/agent"
)

// A Go program registers its own tool in a few lines: a name, a version,
// a JSON Schema for the arguments, the effect, and a handler. The registry
// gives the agent the schemas and the worker the tools it journals.
func Example_registerTool() {
	reg := agent.NewRegistry(agent.Clock(nil))
	err := reg.Register(agent.Tool{
		Name:        "shout",
		Version:     "1",
		Description: "Returns the text in capitals.",
		Schema:      json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		Effect:      agent.Read,
		Handler: func(_ context.Context, inv agent.Invocation) (string, error) {
			var args struct{ Text string }
			if err := json.Unmarshal(inv.Arguments, &args); err != nil {
				return "", err
			}
			return strings.ToUpper(args.Text), nil
		},
	})
	if err != nil {
		panic(err)
	}
	// Then: agent.NewOpenAI(agent.Config{Model: ..., Tools: reg}) as the
	// worker's Agent, and reg.Tools() as its Tools.
	fmt.Println(reg.Names())
	// Output: [clock shout]
}
