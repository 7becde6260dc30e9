package agent_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
)

func noop(context.Context, agent.Invocation) (string, error) { return "", nil }

func TestRegisterRefusesToolsThatCannotBeOffered(t *testing.T) {
	t.Parallel()
	good := agent.Tool{Name: "ok", Effect: agent.Read, Handler: noop, Schema: json.RawMessage(`{"type":"object"}`)}
	for name, tc := range map[string]struct {
		tool agent.Tool
		want string
	}{
		"bad name":          {agent.Tool{Name: "has space", Effect: agent.Read, Handler: noop}, "letters, digits"},
		"no effect":         {agent.Tool{Name: "t", Handler: noop}, "agent.Read or agent.Write"},
		"no handler":        {agent.Tool{Name: "t", Effect: agent.Write}, "no handler"},
		"schema not json":   {agent.Tool{Name: "t", Effect: agent.Read, Handler: noop, Schema: json.RawMessage(`{"type":`)}, "not JSON"},
		"schema not object": {agent.Tool{Name: "t", Effect: agent.Read, Handler: noop, Schema: json.RawMessage(`{"type":"string"}`)}, "object schema"},
		"schema invalid":    {agent.Tool{Name: "t", Effect: agent.Read, Handler: noop, Schema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"nonsense"}}}`)}, "does not compile"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := agent.NewRegistry().Register(tc.tool)
			require.ErrorIs(t, err, agent.ErrInvalidTool)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	reg := agent.NewRegistry(good)
	err := reg.Register(agent.Tool{Name: "other", Effect: agent.Read, Handler: noop}, good)
	require.ErrorIs(t, err, agent.ErrInvalidTool)
	require.Contains(t, err.Error(), "already registered")
	require.Equal(t, []string{"ok"}, reg.Names(), "a failed Register adds nothing")
	require.ErrorIs(t, agent.NewRegistry().Register(good, good), agent.ErrInvalidTool)
}

func TestRegistryToolsCarryVersionAndEffectForTheJournal(t *testing.T) {
	t.Parallel()
	reg := agent.NewRegistry(
		agent.Tool{Name: "look", Effect: agent.Read, Handler: noop},
		agent.Tool{Name: "send", Version: "3", Effect: agent.Write, Handler: func(_ context.Context, inv agent.Invocation) (string, error) {
			return "key " + inv.IdempotencyKey, nil
		}},
	)
	tools := reg.Tools()
	require.Len(t, tools, 2)
	require.Equal(t, "1", tools["look"].Version(), "version defaults to 1")
	require.Equal(t, consumer.EffectRead, tools["look"].Effect())
	require.Equal(t, "3", tools["send"].Version())
	require.Equal(t, consumer.EffectWrite, tools["send"].Effect())
	out, err := tools["send"].Call(context.Background(), consumer.Invocation{IdempotencyKey: "op_1", Arguments: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Equal(t, "key op_1", out)
}
