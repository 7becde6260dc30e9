package agent_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// everythingServer is the MCP reference server's script, installed by
// `make test-deps` (npm ci in testdata/mcp-everything), and node.
func everythingServer(t *testing.T) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: run `make test-deps` (scripts/install-deps.sh node, then npm ci in agent/testdata/mcp-everything)")
	}
	script, err = filepath.Abs("testdata/mcp-everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	require.NoError(t, err)
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the MCP reference server is not installed (%v): run `make test-deps`, which runs npm ci in agent/testdata/mcp-everything", err)
	}
	return node, script
}

// startEverythingHTTP runs the reference server over Streamable HTTP on a
// free port and returns its endpoint once it accepts connections.
func startEverythingHTTP(t *testing.T) string {
	t.Helper()
	node, script := everythingServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(node, script, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return "http://" + addr + "/mcp"
		}
		select {
		case <-exited:
			t.Fatalf("the MCP reference server exited: %s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the MCP reference server did not listen on %s within 30s: %s", addr, out.String())
		}
	}
}

// toolResultEcho is a model that calls the tool named in the user's
// message with the message as its argument, then answers with what the
// tool returned.
func toolResultEcho(tool func(user string) (name, args string)) agenttest.Responder {
	return func(n int, req agenttest.Request) agenttest.Response {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == "tool" {
			return agenttest.Response{Content: "The tool said: " + last.Text()}
		}
		name, args := tool(req.LastUser())
		return agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: fmt.Sprintf("call_%d", n), Name: name, Arguments: args}}}
	}
}

// startMCPWorker runs a worker whose tools are m's.
func (s *stack) startMCPWorker(model *agenttest.Server, m *agent.MCP, change func(*consumer.Config)) func() {
	s.t.Helper()
	reg := agent.NewRegistry()
	a := newAgent(s.t, model, nil)
	return s.startWorker(a, reg, func(c *consumer.Config) {
		c.ToolSource = m
		if change != nil {
			change(c)
		}
	})
}

func newMCP(t *testing.T, s *stack, cfg agent.MCPConfig) *agent.MCP {
	t.Helper()
	if cfg.Logger == nil {
		l := zerolog.New(zerolog.NewTestWriter(t))
		cfg.Logger = &l
	}
	cfg.AllowPrivate = true
	m, err := agent.NewMCP(cfg, s.db.Pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestAToolOfTheReferenceMCPServerIsJournaledAndAnswersOverStdioAndHTTP(t *testing.T) {
	t.Parallel()
	node, script := everythingServer(t)
	endpoint := startEverythingHTTP(t)
	s := newStack(t)
	m := newMCP(t, s, agent.MCPConfig{Servers: []agent.MCPServer{
		{Name: "stdio", Command: []string{node, script, "stdio"}, Trusted: true},
		{Name: "web", URL: endpoint, Trusted: true},
	}})
	model := agenttest.NewResponder(t, toolResultEcho(func(user string) (string, string) {
		server, text, _ := strings.Cut(user, ": ")
		return server + "__echo", fmt.Sprintf(`{"message":%q}`, text)
	}))
	s.startMCPWorker(model, m, nil)

	for _, server := range []string{"stdio", "web"} {
		conv := "conv-" + server
		s.send(conv, "m-"+server, server+": hello from baton over "+server)
		ev := s.await(conv, batonnats.EventReplied, batonnats.EventFailed)
		require.Equal(t, batonnats.EventReplied, ev.Type, "the turn over %s should reply", server)

		var reply string
		require.NoError(t, s.db.Pool.QueryRow(context.Background(),
			`SELECT content FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, conv).Scan(&reply))
		require.Equal(t, "The tool said: Echo: hello from baton over "+server, reply, "the reply uses the tool's result")

		var tool, effect, status, result, key, argsSum, defSum string
		var attached bool
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `
			SELECT tool, effect, status, result, idempotency_key, arguments_sha256, definition_sha256, message_id IS NOT NULL
			FROM operations WHERE conversation_id = $1`, conv).Scan(&tool, &effect, &status, &result, &key, &argsSum, &defSum, &attached))
		require.Equal(t, server+"__echo", tool)
		require.Equal(t, "read", effect, "a trusted server's readOnlyHint makes echo a read")
		require.Equal(t, "completed", status)
		require.Equal(t, "Echo: hello from baton over "+server, result)
		require.True(t, strings.HasPrefix(key, "mcp_"), "the operation carries the key sent to the server, got %q", key)
		require.Len(t, argsSum, 64, "the arguments' hash is journaled")
		require.Len(t, defSum, 64, "the definition's hash is journaled")
		require.True(t, attached, "the operation is attached to the reply")
	}
	require.Equal(t, 2, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM mcp_tools WHERE tool = 'echo' AND effect = 'read'`),
		"each server's echo is recorded with its effect")
}
