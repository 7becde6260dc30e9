package agenttest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPServer is a real MCP server (the MCP Go SDK, over Streamable HTTP)
// with one tool, send, which answers "sent <its arguments>" and counts its
// calls. It says nothing of its effects, so a worker takes send for a
// write: named in the worker's --mcp-approve, its calls wait for a
// person's approval.
type MCPServer struct {
	*httptest.Server

	mu    sync.Mutex
	calls []string
}

// NewMCPServer starts an MCPServer, closed when t ends.
func NewMCPServer(t testing.TB) *MCPServer {
	s := &MCPServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "agenttest", Version: "1"}, nil)
	schema := map[string]any{"type": "object", "properties": map[string]any{"to": map[string]any{"type": "string"}}}
	srv.AddTool(&mcp.Tool{Name: "send", Description: "Sends a message to someone.", InputSchema: schema},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			args := string(req.Params.Arguments)
			s.mu.Lock()
			s.calls = append(s.calls, args)
			s.mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent " + args}}}, nil
		})
	s.Server = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	t.Cleanup(s.Close)
	return s
}

// Calls are the arguments of each call of send that arrived, in order.
func (s *MCPServer) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}
