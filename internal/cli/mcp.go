package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/schema"
)

// mcpFlags configure the MCP servers of a worker (--agent openai, or the
// echo agent with --echo-directives).
type mcpFlags struct {
	MCPServers     []string      `name:"mcp-server" env:"BATON_MCP_SERVERS" sep:";" setting:"MCPServers" placeholder:"NAME=URL" help:"An MCP server over Streamable HTTP whose tools the model may call as NAME__TOOL; repeatable (the variable separates them with ';')."`
	MCPCommands    []string      `name:"mcp-command" env:"BATON_MCP_COMMANDS" sep:";" placeholder:"NAME=COMMAND" help:"An MCP server over stdio: the command (split at spaces) runs with only PATH, HOME and LANG of the worker's environment; repeatable (the variable separates them with ';')."`
	MCPTokenFiles  []string      `name:"mcp-token-file" env:"BATON_MCP_TOKEN_FILES" sep:";" setting:"MCPTokenFiles" placeholder:"NAME=FILE" help:"A file holding the bearer token of an HTTP server; repeatable. The token is never logged."`
	MCPTimeouts    []string      `name:"mcp-server-timeout" env:"BATON_MCP_SERVER_TIMEOUTS" sep:"," setting:"MCPServerTimeouts" placeholder:"NAME=DURATION" help:"A server's own call timeout, instead of --mcp-call-timeout."`
	MCPTrust       []string      `name:"mcp-trust" env:"BATON_MCP_TRUST" sep:"," placeholder:"NAME" help:"Servers whose readOnlyHint counts: a tool is a read only when its server is trusted and says so; every other tool is a write."`
	MCPToolEffects []string      `name:"mcp-tool-effect" env:"BATON_MCP_TOOL_EFFECTS" sep:"," setting:"MCPToolEffects" placeholder:"NAME__TOOL=read|write" help:"A tool's effect, whatever its server says; wins over --mcp-trust."`
	MCPApprove     []string      `name:"mcp-approve" env:"BATON_MCP_APPROVE" sep:"," setting:"MCPApprove" placeholder:"NAME|NAME__TOOL|all-writes" help:"Writes that wait for their user's approval before they are sent: a server's, a tool's, or all-writes."`
	ApprovalTTL    time.Duration `name:"approval-ttl" env:"BATON_APPROVAL_TTL" setting:"ApprovalTTL" help:"How long a call waits for its approval before it is denied. Defaults to ${approval_ttl}."`
	MCPCallTimeout time.Duration `name:"mcp-call-timeout" env:"BATON_MCP_CALL_TIMEOUT" setting:"MCPCallTimeout" help:"Longest wait for one MCP tool call; past it a read fails for the model and a write fails the turn, never sent again. Defaults to ${mcp_call_timeout}."`
	MCPMaxOutput   int           `name:"mcp-max-output-bytes" env:"BATON_MCP_MAX_OUTPUT_BYTES" setting:"MCPMaxOutputBytes" help:"Longest MCP tool output kept and given to the model; a longer one keeps its start, marked as cut. Defaults to ${mcp_max_output}."`
	MCPAllowPriv   bool          `name:"mcp-allow-private" env:"BATON_MCP_ALLOW_PRIVATE" help:"Let HTTP MCP servers be reached on private, loopback and link-local addresses (by URL or redirect); off, such requests are refused."`
}

// any reports whether an MCP server is configured.
func (f mcpFlags) any() bool { return len(f.MCPServers) > 0 || len(f.MCPCommands) > 0 }

// config is the agent's MCPConfig from the flags, without its database.
func (f mcpFlags) config(log zerolog.Logger, reg prometheus.Registerer) (agent.MCPConfig, error) {
	cfg := agent.MCPConfig{
		ToolEffects: map[string]consumer.Effect{}, Approve: f.MCPApprove,
		CallTimeout: f.MCPCallTimeout, MaxOutputBytes: f.MCPMaxOutput, AllowPrivate: f.MCPAllowPriv,
		Logger: &log, Registerer: reg,
	}
	byName := map[string]int{}
	add := func(flag, v string, s agent.MCPServer) error {
		if s.Name == "" || (s.URL == "" && len(s.Command) == 0) {
			return fmt.Errorf("--%s %q: write NAME=%s", flag, v, map[bool]string{true: "URL", false: "COMMAND"}[flag == "mcp-server"])
		}
		byName[s.Name] = len(cfg.Servers)
		cfg.Servers = append(cfg.Servers, s)
		return nil
	}
	for _, v := range f.MCPServers {
		name, u, _ := strings.Cut(v, "=")
		if err := add("mcp-server", v, agent.MCPServer{Name: strings.TrimSpace(name), URL: strings.TrimSpace(u)}); err != nil {
			return cfg, err
		}
	}
	for _, v := range f.MCPCommands {
		name, cmd, _ := strings.Cut(v, "=")
		if err := add("mcp-command", v, agent.MCPServer{Name: strings.TrimSpace(name), Command: strings.Fields(cmd)}); err != nil {
			return cfg, err
		}
	}
	for _, v := range f.MCPTokenFiles {
		name, file, _ := strings.Cut(v, "=")
		i, ok := byName[name]
		if !ok || file == "" {
			return cfg, fmt.Errorf("--mcp-token-file %q: write NAME=FILE for a server given with --mcp-server", v)
		}
		// Read now, so that a wrong path is refused before anything
		// connects; the agent reads it again when it starts.
		if b, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(b)) == "" {
			why := "it is empty"
			if err != nil {
				why = err.Error()
			}
			return cfg, fmt.Errorf("--mcp-token-file %s=%s: cannot read the token file (%s): give a file that holds the server's bearer token", name, file, why)
		}
		cfg.Servers[i].TokenFile = file
	}
	for _, v := range f.MCPTimeouts {
		name, d, _ := strings.Cut(v, "=")
		i, ok := byName[name]
		timeout, err := time.ParseDuration(d)
		if !ok || err != nil || timeout <= 0 {
			return cfg, fmt.Errorf("--mcp-server-timeout %q: write NAME=DURATION, such as %s=2m, for a configured server", v, name)
		}
		cfg.Servers[i].CallTimeout = timeout
	}
	for _, name := range f.MCPTrust {
		i, ok := byName[name]
		if !ok {
			return cfg, fmt.Errorf("--mcp-trust %q: no server of that name; give a NAME from --mcp-server or --mcp-command", name)
		}
		cfg.Servers[i].Trusted = true
	}
	for _, v := range f.MCPToolEffects {
		name, effect, ok := strings.Cut(v, "=")
		if !ok {
			return cfg, fmt.Errorf("--mcp-tool-effect %q: write NAME__TOOL=read or NAME__TOOL=write", v)
		}
		cfg.ToolEffects[name] = consumer.Effect(effect)
	}
	return cfg, nil
}

type mcpCmd struct {
	Accept mcpAcceptCmd `cmd:"" help:"Accept the changed definition of an MCP tool (NAME__TOOL), or of every changed tool of a server (NAME), so that workers offer it again."`
}

type mcpAcceptCmd struct {
	config.Database
	Tool string `arg:"" name:"tool" help:"NAME__TOOL, or a server's NAME for all its changed tools."`
}

func (c *mcpAcceptCmd) Run(ctx context.Context, env *Env) error {
	server, tool, _ := strings.Cut(c.Tool, "__")
	if server == "" {
		return &UsageError{Err: fmt.Errorf("%q: give NAME__TOOL or a server's NAME", c.Tool)}
	}
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	done, err := schema.AcceptMCPTools(ctx, pool, server, tool)
	if err != nil {
		return err
	}
	if len(done) == 0 {
		return &UsageError{Err: fmt.Errorf("%q: no changed definition to accept (`baton status` lists MCP tools and marks changed ones)", c.Tool)}
	}
	for _, a := range done {
		fmt.Fprintf(env.Stdout, "accepted %s__%s: definition sha256 %s (was %s); workers offer it from their next turn\n", a.Server, a.Tool, a.SHA256, a.Previous)
	}
	return nil
}
