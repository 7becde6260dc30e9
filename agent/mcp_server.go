package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// mcpServer is one server's session and the tools it offered.
type mcpServer struct {
	m     *MCP
	spec  MCPServer
	log   zerolog.Logger
	token string

	mu sync.Mutex
	// session is open, or nil; down is until when a server that could
	// not be reached is left out.
	session *mcp.ClientSession
	down    time.Time
	// tools are compiled tools by name, kept while their definition,
	// effect and approval stay the same.
	tools map[string]*compiled
	// warned are the changed definitions already logged (tool and hash).
	warned map[string]bool
	// failing is set while the server could not be listed, so that its
	// failure is logged once, and its recovery too.
	failing  bool
	recorded time.Time
}

// open returns the server's session, connecting when it has none.
func (s *mcpServer) open(ctx context.Context) (*mcp.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != nil {
		return s.session, nil
	}
	if time.Now().Before(s.down) {
		return nil, errMCPDown
	}
	cctx, cancel := context.WithTimeout(ctx, s.m.cfg.ConnectTimeout)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "baton", Version: "1"}, &mcp.ClientOptions{
		// Baton reads the list when a turn starts, so it needs no
		// notifications, and it offers no roots.
		Capabilities: &mcp.ClientCapabilities{},
	})
	var t mcp.Transport
	if s.spec.URL != "" {
		t = &mcp.StreamableClientTransport{
			Endpoint:             s.spec.URL,
			HTTPClient:           newMCPHTTPClient(s.spec.URL, s.token, s.m.cfg.AllowPrivate),
			MaxRetries:           -1,
			DisableStandaloneSSE: true,
			MaxEventSize:         MCPMaxResponseBytes,
		}
	} else {
		cmd := exec.Command(s.spec.Command[0], s.spec.Command[1:]...)
		// The worker's own settings (database URL, keys) never reach a
		// server's process.
		cmd.Env = []string{}
		for _, k := range []string{"PATH", "HOME", "LANG"} {
			if v, ok := os.LookupEnv(k); ok {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		t = &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second}
	}
	cs, err := client.Connect(cctx, t, nil)
	if err != nil {
		s.down = time.Now().Add(s.m.cfg.RetryAfter)
		return nil, s.redact(err)
	}
	s.session = cs
	return cs, nil
}

// errMCPDown: the server failed lately and is left out for a while.
var errMCPDown = errors.New("it could not be reached lately; it is tried again shortly")

// broken drops a session after a transport failure: the next use
// connects again.
func (s *mcpServer) broken(cs *mcp.ClientSession) {
	s.mu.Lock()
	if s.session != cs {
		s.mu.Unlock()
		return
	}
	s.session = nil
	s.mu.Unlock()
	go func() { _ = cs.Close() }()
}

func (s *mcpServer) drop() {
	s.mu.Lock()
	cs := s.session
	s.session = nil
	s.mu.Unlock()
	if cs != nil {
		_ = cs.Close()
	}
}

// redact takes the server's URL, and its query above all, out of an
// error's text: a secret in a URL must not reach a log or the model.
func (s *mcpServer) redact(err error) error {
	if err == nil || s.spec.URL == "" {
		return err
	}
	msg := strings.ReplaceAll(err.Error(), s.spec.URL, redactURL(s.spec.URL))
	if u, perr := url.Parse(s.spec.URL); perr == nil && u.RawQuery != "" {
		msg = strings.ReplaceAll(msg, u.RawQuery, "[redacted]")
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// turnTools lists the server's tools for a turn.
func (s *mcpServer) turnTools(ctx context.Context) ([]*compiled, error) {
	list, err := s.list(ctx)
	if err != nil {
		s.m.metrics.listFailures.WithLabelValues(s.spec.Name).Inc()
		s.mu.Lock()
		first := !s.failing
		s.failing = true
		s.mu.Unlock()
		if first {
			s.log.Warn().Err(err).Str("server", describeMCPServer(s.spec)).
				Msg("MCP server unavailable when a turn started; its tools are not offered until it answers")
			if rerr := schema.RecordMCPServer(context.WithoutCancel(ctx), s.m.db, s.spec.Name, err.Error()); rerr != nil {
				return nil, rerr
			}
		}
		return nil, nil
	}
	s.mu.Lock()
	recovered := s.failing
	s.failing = false
	touch := recovered || time.Since(s.recorded) >= mcpListingRecord
	if touch {
		s.recorded = time.Now()
	}
	s.mu.Unlock()
	if recovered {
		s.log.Info().Msg("MCP server answers again; its tools are offered")
	}
	if touch {
		if err := schema.RecordMCPServer(ctx, s.m.db, s.spec.Name, ""); err != nil {
			return nil, err
		}
	}
	type entry struct {
		def  mcpDefinition
		tool *mcp.Tool
		name string
		sum  string
		eff  consumer.Effect
	}
	var entries []entry
	var listing []schema.MCPListedTool
	for _, t := range list {
		name := mcpToolName(s.spec.Name, t.Name)
		if !toolName.MatchString(name) {
			s.warnOnce("name:"+t.Name, func(e *zerolog.Event) {
				e.Str("mcp_tool", t.Name).Msg("MCP tool not offered: NAME__TOOL must be 1 to 64 letters, digits, '_' or '-'")
			})
			continue
		}
		def := definitionOf(t)
		raw, _ := json.Marshal(def)
		sum := sha256.Sum256(raw)
		e := entry{def: def, tool: t, name: name, sum: hex.EncodeToString(sum[:]), eff: s.m.effectOf(s.spec, name, t)}
		entries = append(entries, e)
		listing = append(listing, schema.MCPListedTool{Tool: t.Name, SHA256: e.sum, Definition: raw, Effect: e.eff})
	}
	states, err := schema.RecordMCPListing(ctx, s.m.db, s.spec.Name, listing)
	if err != nil {
		return nil, err
	}
	var out []*compiled
	disabled := 0
	for _, e := range entries {
		st := states[e.tool.Name]
		if st.Changed {
			disabled++
			s.warnOnce("changed:"+e.tool.Name+":"+e.sum, func(ev *zerolog.Event) {
				s.m.metrics.definitionChanges.WithLabelValues(s.spec.Name).Inc()
				ev.Str("tool", e.name).Str("accepted_sha256", st.Accepted).Str("listed_sha256", e.sum).
					Msg("MCP tool definition changed since it was accepted; the tool is not offered until an operator runs `baton mcp accept " + e.name + "`")
			})
			continue
		}
		c, err := s.compiledTool(e.name, e.tool, e.sum, e.eff)
		if err != nil {
			s.warnOnce("schema:"+e.tool.Name+":"+e.sum, func(ev *zerolog.Event) {
				ev.Err(err).Str("tool", e.name).Msg("MCP tool not offered: its input schema cannot be used")
			})
			continue
		}
		out = append(out, c)
	}
	s.m.metrics.disabled.WithLabelValues(s.spec.Name).Set(float64(disabled))
	return out, nil
}

// mcpListingRecord is how often a server that answers has its listing
// time recorded, for `baton status`.
const mcpListingRecord = time.Minute

// list reads every page of the server's tool list.
func (s *mcpServer) list(ctx context.Context) ([]*mcp.Tool, error) {
	cs, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, s.m.cfg.ConnectTimeout)
	defer cancel()
	var out []*mcp.Tool
	for t, err := range cs.Tools(lctx, nil) {
		if err != nil {
			if ctx.Err() == nil {
				s.broken(cs)
			}
			return nil, fmt.Errorf("list tools: %w", s.redact(err))
		}
		out = append(out, t)
	}
	return out, nil
}

func (s *mcpServer) warnOnce(key string, log func(*zerolog.Event)) {
	s.mu.Lock()
	seen := s.warned[key]
	s.warned[key] = true
	s.mu.Unlock()
	if !seen {
		log(s.log.Warn())
	}
}

// mcpDefinition is what of a tool's definition is hashed: everything
// that tells the model what it does, or Baton what it may assume.
type mcpDefinition struct {
	Name         string          `json:"name"`
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description,omitempty"`
	InputSchema  any             `json:"inputSchema"`
	OutputSchema any             `json:"outputSchema,omitempty"`
	Annotations  *mcpAnnotations `json:"annotations,omitempty"`
}

type mcpAnnotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    bool   `json:"readOnlyHint"`
	DestructiveHint *bool  `json:"destructiveHint,omitempty"`
	IdempotentHint  bool   `json:"idempotentHint"`
	OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
}

// definitionOf is a tool's definition in a stable form: maps marshal with
// sorted keys, so the same definition always hashes the same.
func definitionOf(t *mcp.Tool) mcpDefinition {
	d := mcpDefinition{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema}
	if a := t.Annotations; a != nil {
		d.Annotations = &mcpAnnotations{Title: a.Title, ReadOnlyHint: a.ReadOnlyHint, DestructiveHint: a.DestructiveHint,
			IdempotentHint: a.IdempotentHint, OpenWorldHint: a.OpenWorldHint}
	}
	return d
}

// compiledTool is the tool the model is offered for an MCP tool, kept
// while its definition, effect and approval stay the same.
func (s *mcpServer) compiledTool(name string, t *mcp.Tool, sum string, effect consumer.Effect) (*compiled, error) {
	approval := effect == consumer.EffectWrite && s.m.needsApproval(s.spec.Name, name)
	s.mu.Lock()
	c, ok := s.tools[name]
	s.mu.Unlock()
	if ok && c.defSHA256 == sum && c.spec.Effect == effect && c.approval == approval {
		return c, nil
	}
	schemaJSON, err := json.Marshal(t.InputSchema)
	if err != nil || t.InputSchema == nil {
		schemaJSON = []byte(`{"type":"object"}`)
	}
	desc := t.Description
	if desc == "" {
		desc = t.Title
	}
	remote := t.Name
	c, err = compile(Tool{
		Name:        name,
		Version:     "sha256:" + sum[:16],
		Description: desc,
		Schema:      schemaJSON,
		Effect:      effect,
		Handler: func(ctx context.Context, inv Invocation) (string, error) {
			return s.call(ctx, name, remote, effect, inv)
		},
	})
	if err != nil {
		return nil, err
	}
	c.server, c.defSHA256, c.approval = s.spec.Name, sum, approval
	s.mu.Lock()
	s.tools[name] = c
	s.mu.Unlock()
	return c, nil
}

// mcpIdempotencyKey is the key of one call: stable for the call (a turn
// that resumes after an approval sends the one stored with it), different
// for any other call and for every server.
func mcpIdempotencyKey(server, scope, toolCallID string) string {
	sum := sha256.Sum256([]byte(server + "\x00" + scope + "\x00" + toolCallID))
	return "mcp_" + hex.EncodeToString(sum[:16])
}

// call sends one tools/call. The server's answer, isError included, is a
// completed call; a transport failure is a failed read (the model reads
// why) or a write whose outcome is unknown.
func (s *mcpServer) call(ctx context.Context, name, remote string, effect consumer.Effect, inv Invocation) (string, error) {
	start := time.Now()
	outcome := "completed"
	defer func() {
		s.m.metrics.calls.WithLabelValues(s.spec.Name, outcome).Inc()
		s.m.metrics.callSeconds.WithLabelValues(s.spec.Name).Observe(time.Since(start).Seconds())
	}()
	cs, err := s.open(ctx)
	if err != nil {
		// Nothing was sent.
		outcome = "unavailable"
		s.log.Warn().Err(err).Str("tool", name).Int64("operation_id", inv.OperationID).Msg("MCP call not sent: server unavailable")
		return "", fmt.Errorf("the tool's server is not available, the call was not made; try again later")
	}
	cctx, cancel := context.WithTimeout(withIdempotencyKey(ctx, inv.IdempotencyKey), s.spec.CallTimeout)
	defer cancel()
	res, err := callTool(cctx, s, cs, &mcp.CallToolParams{
		Name:      remote,
		Arguments: json.RawMessage(inv.Arguments),
		Meta:      mcp.Meta{"idempotencyKey": inv.IdempotencyKey},
	})
	if err != nil {
		var rpc *jsonrpc.Error
		// The SDK reports a failed HTTP exchange as "rejected by
		// transport" (-32005), though the request may have left: that is
		// no answer of the server's.
		if errors.As(err, &rpc) && rpc.Code != codeRejectedByTransport {
			// The server answered with a protocol error: it refused the
			// call, which is an answer.
			outcome = "refused"
			s.log.Info().Str("tool", name).Int64("code", rpc.Code).Str("message", rpc.Message).Msg("MCP server refused a call")
			return "", fmt.Errorf("the server refused the call: %s", truncate(rpc.Message, 500))
		}
		cause := s.failure(ctx, cctx, err)
		// The SDK reports these with %v, not %w: their text tells them.
		if msg := err.Error(); strings.Contains(msg, errResponseTooLarge.Error()) || strings.Contains(msg, "exceeded the configured maximum") {
			cause = fmt.Sprintf("its answer is larger than %d MiB, the most Baton reads, and was not read", MCPMaxResponseBytes>>20)
		}
		if ctx.Err() == nil {
			s.broken(cs)
		}
		outcome = "failed"
		ev := s.log.Warn().Err(s.redact(err)).Str("tool", name).Str("effect", string(effect)).Int64("operation_id", inv.OperationID).Str("idempotency_key", inv.IdempotencyKey)
		if effect == consumer.EffectWrite {
			outcome = "unknown"
			ev.Msg("MCP write failed with its outcome unknown; it is not sent again and the turn fails")
			return "", &consumer.OutcomeUnknownError{Tool: name, Err: fmt.Errorf("%s: %s", s.spec.Name, cause)}
		}
		ev.Msg("MCP read failed")
		return "", errors.New(cause)
	}
	out := resultText(res)
	if res.IsError {
		out = "[the tool reported an error] " + out
	}
	if max := s.m.cfg.MaxOutputBytes; len(out) > max {
		s.log.Info().Str("tool", name).Int("bytes", len(out)).Int("kept", max).Msg("MCP tool output cut")
		out = cutOutput(out, max)
	}
	return out, nil
}

// callTool sends one tools/call, once. It is a variable only so that the
// chaos harness can prove it fails a worker that sends a write again after
// its outcome became unknown: a build with the chaosbroken tag replaces it,
// and no other code does.
var callTool = func(ctx context.Context, _ *mcpServer, cs *mcp.ClientSession, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	return cs.CallTool(ctx, p)
}

// codeRejectedByTransport is the SDK's code for an HTTP exchange that
// failed (jsonrpc2.ErrRejected).
const codeRejectedByTransport = -32005

// failure says for the model and the log why a call got no answer.
func (s *mcpServer) failure(turn, call context.Context, err error) string {
	switch {
	case turn.Err() != nil:
		return "the turn stopped before the server answered"
	case errors.Is(call.Err(), context.DeadlineExceeded):
		return fmt.Sprintf("the server did not answer within %s", s.spec.CallTimeout)
	case errors.Is(err, mcp.ErrConnectionClosed), isRejected(err):
		return "the connection to the server was lost before it answered"
	}
	return "the call failed before the server answered: " + s.redact(err).Error()
}

// cutOutput keeps the start of out, marked as cut, within max bytes.
func cutOutput(out string, max int) string {
	mark := fmt.Sprintf("\n[output cut: %d bytes, the first %%d kept]", len(out))
	keep := max - len(mark) - 8
	for keep > 0 && keep < len(out) && !utf8RuneStart(out[keep]) {
		keep--
	}
	return out[:keep] + fmt.Sprintf(mark, keep)
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// resultText is a tool result as text for the model.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link %s]", c.URI))
		case *mcp.EmbeddedResource:
			if c.Resource != nil && c.Resource.Text != "" {
				parts = append(parts, c.Resource.Text)
			} else if c.Resource != nil {
				parts = append(parts, fmt.Sprintf("[resource %s]", c.Resource.URI))
			}
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	return strings.Join(parts, "\n")
}

func isRejected(err error) bool {
	var rpc *jsonrpc.Error
	return errors.As(err, &rpc) && rpc.Code == codeRejectedByTransport
}
