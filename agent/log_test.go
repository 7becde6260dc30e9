package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
)

// syncBuffer is a buffer the agent's logs can be written to from any
// goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

// TestLogLinesNameTheComponentOnce: the worker gives the agent a logger
// that says component=agent; the agent's lines say it once.
func TestLogLinesNameTheComponentOnce(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := zerolog.New(&buf).Level(zerolog.DebugLevel).With().Str("component", "agent").Logger()
	srv := agenttest.NewServer(t,
		agenttest.Response{Status: 502, Body: `{"error":{"message":"upstream"}}`},
		agenttest.Response{Content: "ok"},
	)
	a := newAgent(t, srv, func(c *agent.Config) { c.Logger = &log })
	_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.NoError(t, err)

	lines := buf.lines()
	require.Len(t, lines, 2, "the request and its retry: %v", lines)
	for _, line := range lines {
		require.Equal(t, 1, strings.Count(line, `"component":`), "the component key appears once in %s", line)
		var fields map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &fields))
		require.Equal(t, "agent", fields["component"])
		require.Equal(t, "test-model", fields["model"])
		require.Equal(t, "run_test", fields["run_id"])
		require.NotContains(t, line, "sk-test", "no log line holds the API key")
	}
	require.Contains(t, lines[1], `"message":"model call failed; retrying"`)
}
