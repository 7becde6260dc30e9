package e2e_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
)

// lateSource is a tool source set once the page's database exists.
type lateSource struct{ m atomic.Pointer[agent.MCP] }

func (l *lateSource) TurnTools(ctx context.Context) (consumer.Tools, error) {
	return l.m.Load().TurnTools(ctx)
}

func TestBrowserShowsACallThatWaitsForApprovalWithApproveAndDeny(t *testing.T) {
	// An MCP server whose send_mail counts what it sends.
	var sent atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "send_mail", Description: "Sends a mail.", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sent.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "mail sent"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	t.Cleanup(hs.Close)
	model := agenttest.NewResponder(t, func(n int, req agenttest.Request) agenttest.Response {
		if last := req.Messages[len(req.Messages)-1]; last.Role == "tool" {
			return agenttest.Response{Content: "Done: " + last.Text()}
		}
		return agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_mail", Name: "mail__send_mail", Arguments: `{"to":"bob@example.com","subject":"` + req.LastUser() + `"}`}}}
	})
	source := &lateSource{}
	p := startPage(t, func(c *consumer.Config, nc *natsclient.Conn) {
		a, err := agent.NewOpenAI(agent.Config{BaseURL: model.BaseURL(), APIKey: "sk-test", Model: "test"})
		require.NoError(t, err)
		c.Agent, c.ToolSource = a, source
	})
	m, err := agent.NewMCP(agent.MCPConfig{Servers: []agent.MCPServer{{Name: "mail", URL: hs.URL}}, Approve: []string{"all-writes"}, AllowPrivate: true}, p.db.Pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	source.m.Store(m)

	p.newConversation("mail")
	p.send("lunch on friday")
	p.waitJS("the call that waits for approval", `[...document.querySelectorAll('.approval')].some(e => e.textContent.includes("mail__send_mail") && e.textContent.includes("bob@example.com"))`, 20*time.Second)
	p.screenshot("waiting-for-approval")
	require.Zero(t, sent.Load(), "nothing is sent before the user approves")
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Click(".approval .approve")))
	p.waitJS("the reply after the approved call", hasBubble("assistant", "Done: mail sent"), 20*time.Second)
	require.EqualValues(t, 1, sent.Load(), "the approved call was sent once")

	p.send("dinner on saturday")
	p.waitJS("the second call that waits", `document.querySelectorAll('.approval .deny').length === 1`, 20*time.Second)
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Click(".approval .deny")))
	p.waitJS("the reply after the denied call", hasBubble("assistant", "the user denied it"), 20*time.Second)
	p.screenshot("denied")
	require.EqualValues(t, 1, sent.Load(), "a denied call is not sent")
	require.False(t, p.js(`document.querySelectorAll('.approval').length > 0`), "no approval is left on the page")
}
