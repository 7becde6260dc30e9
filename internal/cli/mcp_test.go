package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/schema"
)

// mcpStatus is what these tests read of `baton status --json`.
type mcpStatus struct {
	MCPServers []struct {
		Server string `json:"server"`
		Tools  []struct {
			Tool     string `json:"tool"`
			Effect   string `json:"effect"`
			Changed  bool   `json:"changed"`
			ListedAt string `json:"listed_at"`
		} `json:"tools"`
		ListedAt *string `json:"listed_at"`
	} `json:"mcp_servers"`
	Attention []string `json:"attention"`
}

func TestStatusListsMCPToolsWithTheirEffectsAndMCPAcceptOffersAChangedOneAgain(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	ctx := context.Background()
	listing := func(searchHash string) {
		_, err := schema.RecordMCPListing(ctx, s.db.Pool, "docs", []schema.MCPListedTool{
			{Tool: "search", SHA256: searchHash, Definition: []byte(`{"name":"search","d":"` + searchHash + `"}`), Effect: schema.EffectRead},
			{Tool: "publish", SHA256: "p1", Definition: []byte(`{"name":"publish"}`), Effect: schema.EffectWrite},
		})
		require.NoError(t, err)
		require.NoError(t, schema.RecordMCPServer(ctx, s.db.Pool, "docs", ""))
	}
	report := func() (mcpStatus, int) {
		out, stderr, code := run(t, s.args("status", "--json", "--slot", s.slot, "--max-pending-age", "1h")...)
		var rep mcpStatus
		require.NoError(t, json.Unmarshal([]byte(out), &rep), "status --json printed %q; stderr: %s", out, stderr)
		return rep, code
	}

	listing("s1")
	rep, _ := report()
	require.Len(t, rep.MCPServers, 1)
	require.Equal(t, "docs", rep.MCPServers[0].Server)
	require.NotNil(t, rep.MCPServers[0].ListedAt, "status says when the server was listed")
	effects := map[string]string{}
	for _, tool := range rep.MCPServers[0].Tools {
		effects[tool.Tool] = tool.Effect
		require.False(t, tool.Changed)
		require.NotEmpty(t, tool.ListedAt)
	}
	require.Equal(t, map[string]string{"search": "read", "publish": "write"}, effects)
	require.Empty(t, attentionAbout(statusReport{Attention: rep.Attention}, "MCP"), "nothing to do while no definition changed")

	listing("s2")
	rep, code := report()
	require.Equal(t, cli.ExitNeedsAttention, code, "a changed definition needs an operator: %v", rep.Attention)
	require.NotEmpty(t, attentionAbout(statusReport{Attention: rep.Attention}, "docs__search", "baton mcp accept docs__search"), "%v", rep.Attention)

	_, stderr, code := run(t, "mcp", "accept", "docs__publish", "--database-url", s.db.URL)
	require.NotZero(t, code, "a tool that did not change has nothing to accept")
	require.Contains(t, stderr, "no changed definition to accept")

	out, stderr, code := run(t, "mcp", "accept", "docs__search", "--database-url", s.db.URL)
	require.Zero(t, code, stderr)
	require.Contains(t, out, "accepted docs__search")
	rep, _ = report()
	for _, tool := range rep.MCPServers[0].Tools {
		require.False(t, tool.Changed, "%s is accepted", tool.Tool)
	}
	require.False(t, strings.Contains(strings.Join(rep.Attention, "\n"), "MCP"), "%v", rep.Attention)
}

func TestWrongMCPSettingsAreRefusedWithTheFlagToFix(t *testing.T) {
	t.Parallel()
	openai := []string{"worker", "--agent", "openai", "--model", "m"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--mcp-server", "docs=https://mcp.example.com/mcp"}, "--mcp-server and --mcp-command need an agent that calls tools"},
		{append(openai, "--mcp-server", "bad__name=https://mcp.example.com/mcp"), "--mcp-server / BATON_MCP_SERVERS bad__name"},
		{append(openai, "--mcp-server", "docs=ftp://mcp.example.com/mcp"), "the URL of an MCP server is http:// or https://"},
		{append(openai, "--mcp-server", "docs=https://user:hunter2secret@mcp.example.com/mcp"), "put no credentials in the URL"},
		{append(openai, "--mcp-server", "docs"), `--mcp-server "docs": write NAME=URL`},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-trust", "other"), `--mcp-trust "other": no server of that name`},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-tool-effect", "docs__search=maybe"), "--mcp-tool-effect / BATON_MCP_TOOL_EFFECTS docs__search=maybe: an effect is read or write"},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-tool-effect", "other__search=read"), "name a tool as SERVER__TOOL, with a configured server"},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-approve", "other"), "--mcp-approve / BATON_MCP_APPROVE other"},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-server-timeout", "docs=soon"), `--mcp-server-timeout "docs=soon": write NAME=DURATION`},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-max-output-bytes", "10"), "--mcp-max-output-bytes / BATON_MCP_MAX_OUTPUT_BYTES 10: give at least 256 bytes"},
		{append(openai, "--mcp-server", "docs=https://a.example/mcp", "--mcp-token-file", "docs=/nonexistent/token"), "cannot read the token file"},
		{append(openai, "--approval-ttl", "10ms"), "--approval-ttl / BATON_APPROVAL_TTL 10ms"},
	} {
		_, stderr, code := run(t, append(tc.args, "--database-url", "postgres://127.0.0.1:1/none")...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "hunter2secret", "a refused URL's password is not shown")
	}
}
