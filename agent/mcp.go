package agent

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/schema"
)

// Defaults of an MCPConfig.
const (
	DefaultMCPCallTimeout    = 30 * time.Second
	DefaultMCPConnectTimeout = 10 * time.Second
	DefaultMCPMaxOutputBytes = 64 << 10
	// DefaultMCPRetryAfter is how long a server that could not be reached
	// is left out of turns before the next try.
	DefaultMCPRetryAfter = 5 * time.Second
	// MCPMaxResponseBytes is the largest answer read from a server, over
	// either transport (the SDK's own limit of one message on stdio): a
	// larger one is not read.
	MCPMaxResponseBytes = 16 << 20
	// MCPApproveAllWrites in MCPConfig.Approve makes every write of every
	// server wait for approval.
	MCPApproveAllWrites = "all-writes"
	// mcpToolSeparator joins a server's name and its tool's: NAME__TOOL.
	mcpToolSeparator = "__"
)

// MCPServer is one MCP server whose tools are offered to the model as
// NAME__TOOL.
type MCPServer struct {
	// Name is how the server's tools are named (NAME__TOOL) and how
	// settings refer to it: 1 to 32 letters, digits, '-' or single '_',
	// starting with a letter or digit. Required.
	Name string
	// URL is a Streamable HTTP endpoint (--mcp-server NAME=URL). Exactly
	// one of URL and Command is required.
	URL string
	// Command runs a server over stdio (--mcp-command NAME=COMMAND): the
	// program and its arguments. It gets only PATH, HOME and LANG of the
	// worker's environment, never the worker's own settings.
	Command []string
	// TokenFile holds a bearer token sent to an HTTP server
	// (--mcp-token-file NAME=FILE), read at start; never logged. Defaults
	// to none.
	TokenFile string
	// CallTimeout bounds one tools/call to this server
	// (--mcp-server-timeout NAME=DURATION). Defaults to
	// MCPConfig.CallTimeout.
	CallTimeout time.Duration
	// Trusted makes the server's readOnlyHint count (--mcp-trust NAME): a
	// tool is read-only only when its server is trusted and says so.
	// Defaults to false: every tool of the server is a write.
	Trusted bool
}

// MCPConfig configures the MCP servers of a worker. It holds settings
// only: the database comes to NewMCP.
type MCPConfig struct {
	// Servers are the MCP servers. Defaults to none.
	Servers []MCPServer
	// ToolEffects set a tool's effect whatever its server says
	// (--mcp-tool-effect NAME__TOOL=read|write). They win over trust and
	// annotations. Defaults to none.
	ToolEffects map[string]consumer.Effect
	// Approve lists what waits for a person's approval before it is sent
	// (--mcp-approve): a server's NAME, a tool's NAME__TOOL, or
	// "all-writes". Only writes wait: a read never does. Defaults to none.
	Approve []string
	// CallTimeout bounds one tools/call (--mcp-call-timeout); past it a
	// read fails for the model, and a write's outcome is unknown: the
	// turn fails visibly and the call is not sent again. Defaults to 30s.
	CallTimeout time.Duration
	// ConnectTimeout bounds connecting to a server and listing its tools
	// when a turn starts. Defaults to 10s.
	ConnectTimeout time.Duration
	// RetryAfter is how long a server that could not be reached is left
	// out of turns before the next try. Defaults to 5s.
	RetryAfter time.Duration
	// MaxOutputBytes caps a tool's output as it is kept in the journal and
	// given to the model (--mcp-max-output-bytes); a longer one keeps its
	// start, marked as cut. Defaults to 64 KiB.
	MaxOutputBytes int
	// AllowPrivate lets HTTP servers be reached on private, loopback and
	// link-local addresses, by URL or by redirect (--mcp-allow-private).
	// Defaults to false: such a request is refused before it is sent.
	AllowPrivate bool
	// Logger receives the operator's log lines. Defaults to none.
	Logger *zerolog.Logger
	// Registerer receives the MCP metrics. Defaults to none.
	Registerer prometheus.Registerer
}

// WithDefaults returns a copy with every zero field set to its default.
func (c MCPConfig) WithDefaults() MCPConfig {
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultMCPCallTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultMCPConnectTimeout
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultMCPRetryAfter
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMCPMaxOutputBytes
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

var mcpServerName = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]|_[A-Za-z0-9-]){0,31}$`)

// Validate returns a *setting.Error for the first setting that is wrong.
func (c MCPConfig) Validate() error {
	seen := map[string]bool{}
	for _, s := range c.Servers {
		switch {
		case !mcpServerName.MatchString(s.Name):
			return setting.Errorf("MCPServers", s.Name, "a server name is 1 to 32 letters, digits, '-' or single '_' (not \"__\", which separates it from its tools' names), starting with a letter or digit")
		case seen[s.Name]:
			return setting.Errorf("MCPServers", s.Name, "two servers have this name: give each its own")
		case (s.URL == "") == (len(s.Command) == 0):
			return setting.Errorf("MCPServers", s.Name, "give either a URL (--mcp-server NAME=URL) or a command (--mcp-command NAME=COMMAND)")
		case s.CallTimeout < 0:
			return setting.Errorf("MCPServerTimeouts", s.Name+"="+s.CallTimeout.String(), "must be positive")
		}
		seen[s.Name] = true
		if s.URL != "" {
			u, err := url.Parse(s.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return setting.Errorf("MCPServers", s.Name+"="+redactURL(s.URL), "the URL of an MCP server is http:// or https:// with a host")
			}
			if u.User != nil {
				return setting.Errorf("MCPServers", s.Name+"="+redactURL(s.URL), "put no credentials in the URL: give a bearer token in a file (--mcp-token-file %s=FILE)", s.Name)
			}
		}
		if s.TokenFile != "" && s.URL == "" {
			return setting.Errorf("MCPTokenFiles", s.Name, "a bearer token is for an HTTP server; a stdio server takes its credentials from its own configuration")
		}
	}
	for name, e := range c.ToolEffects {
		server, _, ok := strings.Cut(name, mcpToolSeparator)
		switch {
		case !ok || !seen[server]:
			return setting.Errorf("MCPToolEffects", name, "name a tool as SERVER__TOOL, with a configured server")
		case e != consumer.EffectRead && e != consumer.EffectWrite:
			return setting.Errorf("MCPToolEffects", name+"="+string(e), "an effect is read or write")
		}
	}
	for _, a := range c.Approve {
		server, _, _ := strings.Cut(a, mcpToolSeparator)
		if a != MCPApproveAllWrites && !seen[server] {
			return setting.Errorf("MCPApprove", a, "give %s, a configured server's NAME, or a tool's NAME__TOOL", MCPApproveAllWrites)
		}
	}
	switch {
	case c.CallTimeout <= 0:
		return setting.Errorf("MCPCallTimeout", c.CallTimeout, "must be positive")
	case c.ConnectTimeout <= 0:
		return setting.Errorf("MCPConnectTimeout", c.ConnectTimeout, "must be positive")
	case c.RetryAfter <= 0:
		return setting.Errorf("MCPRetryAfter", c.RetryAfter, "must be positive")
	case c.MaxOutputBytes < 256:
		return setting.Errorf("MCPMaxOutputBytes", c.MaxOutputBytes, "give at least 256 bytes")
	}
	return nil
}

// MCP is the tools of MCP servers, listed when each turn starts: a
// consumer.ToolSource. Each server has one session per worker, opened on
// first use and again after it broke.
type MCP struct {
	cfg MCPConfig
	// db records listings and definitions, and reads the accepted ones
	// (mcp_tools, mcp_servers).
	db      schema.Executor
	log     zerolog.Logger
	metrics *mcpMetrics
	servers []*mcpServer
}

var _ consumer.ToolSource = (*MCP)(nil)

// NewMCP checks the configuration and reads the token files. db records
// the servers' listings and the accepted tool definitions (mcp_tools,
// mcp_servers); it is required when Servers are given. NewMCP connects to
// nothing: the first turn does.
func NewMCP(cfg MCPConfig, db schema.Executor) (*MCP, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Servers) > 0 && db == nil {
		return nil, errors.New("agent: the database is nil: give NewMCP a pool, since the workers agree on accepted tool definitions through the database")
	}
	// The caller's logger names the component (the worker's says
	// component=mcp).
	m := &MCP{cfg: cfg, db: db, log: *cfg.Logger, metrics: newMCPMetrics(cfg.Registerer)}
	for _, s := range cfg.Servers {
		if s.CallTimeout == 0 {
			s.CallTimeout = cfg.CallTimeout
		}
		srv := &mcpServer{m: m, spec: s, log: m.log.With().Str("mcp_server", s.Name).Logger(), tools: map[string]*compiled{}, warned: map[string]bool{}}
		if s.TokenFile != "" {
			b, err := os.ReadFile(s.TokenFile)
			if err != nil {
				return nil, setting.Errorf("MCPTokenFiles", s.Name+"="+s.TokenFile, "cannot read the token file: %v", err)
			}
			srv.token = strings.TrimSpace(string(b))
			if srv.token == "" {
				return nil, setting.Errorf("MCPTokenFiles", s.Name+"="+s.TokenFile, "the token file is empty")
			}
		}
		m.servers = append(m.servers, srv)
	}
	return m, nil
}

// Close ends every session (a stdio server's process with it).
func (m *MCP) Close() error {
	for _, s := range m.servers {
		s.drop()
	}
	return nil
}

// TurnTools lists every server's tools, at once, for a turn that starts.
// A server that cannot be reached, or whose listing fails, offers no tool
// this turn (and is logged); a tool whose definition changed since it was
// accepted is left out until an operator accepts it. Only an error of the
// database fails the turn.
func (m *MCP) TurnTools(ctx context.Context) (consumer.Tools, error) {
	type listed struct {
		tools []*compiled
		err   error
	}
	out := make([]listed, len(m.servers))
	var wg sync.WaitGroup
	for i, s := range m.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].tools, out[i].err = s.turnTools(ctx)
		}()
	}
	wg.Wait()
	ts := consumer.Tools{}
	for _, l := range out {
		if l.err != nil {
			return nil, l.err
		}
		for _, t := range l.tools {
			ts.Register(t)
		}
	}
	return ts, nil
}

// effectOf is a tool's effect by the rule: an override wins; otherwise a
// read only when the server is trusted and the tool says readOnlyHint.
func (m *MCP) effectOf(s MCPServer, name string, t *mcp.Tool) consumer.Effect {
	if e, ok := m.cfg.ToolEffects[name]; ok {
		return e
	}
	if s.Trusted && t.Annotations != nil && t.Annotations.ReadOnlyHint {
		return consumer.EffectRead
	}
	return consumer.EffectWrite
}

// needsApproval says whether a write of the named tool waits for approval.
func (m *MCP) needsApproval(server, name string) bool {
	return slices.ContainsFunc(m.cfg.Approve, func(a string) bool {
		return a == MCPApproveAllWrites || a == server || a == name
	})
}

// redactURL is u without credentials, query or fragment, for logs and
// errors: a secret in a URL must not reach them.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an unparsable URL)"
	}
	p.User, p.RawQuery, p.Fragment, p.ForceQuery = nil, "", "", false
	return p.String()
}

// mcpToolName is what the model calls a server's tool.
func mcpToolName(server, tool string) string { return server + mcpToolSeparator + tool }

// describeMCPServer is a server's kind and place for logs, without
// secrets.
func describeMCPServer(s MCPServer) string {
	if s.URL != "" {
		return redactURL(s.URL)
	}
	return fmt.Sprintf("command %s", s.Command[0])
}
