//go:build chaosbroken

package agent

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The chaos harness's own test runs workers built with the chaosbroken tag,
// whose MCP client sends a call again, on a new session and with the same
// idempotency key, when the first got no answer (a dropped connection): the
// harness's MCP server receives that key twice, and the harness must fail
// the build.
func init() {
	callTool = func(ctx context.Context, s *mcpServer, cs *mcp.ClientSession, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
		res, err := cs.CallTool(ctx, p)
		var rpc *jsonrpc.Error
		if err == nil || ctx.Err() != nil || (errors.As(err, &rpc) && rpc.Code != codeRejectedByTransport) {
			return res, err
		}
		s.broken(cs)
		again, oerr := s.open(ctx)
		if oerr != nil {
			return nil, err
		}
		return again.CallTool(ctx, p)
	}
}
