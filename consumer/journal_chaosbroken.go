//go:build chaosbroken

package consumer

import (
	"context"

	"github.com/batonhq/baton/schema"
)

// The chaos harness's own test runs workers built with the chaosbroken tag,
// whose journal sends a call of a tool with a definition (an MCP server's)
// first and journals it after: the harness's MCP server finds no started
// operation when such a call arrives, and the harness must fail the build.
func init() {
	correct := startAndRun
	startAndRun = func(ctx context.Context, j *journal, call ToolCall, tool Tool, inv Invocation) (string, error) {
		if definitionSHA256(tool) == "" {
			return correct(ctx, j, call, tool, inv)
		}
		result, callErr := tool.Call(ctx, inv)
		if err := j.start(ctx, call, tool, &inv); err != nil {
			return "", err
		}
		finish := context.WithoutCancel(ctx)
		if callErr != nil {
			if err := schema.FailOperation(finish, j.pool, inv.OperationID, callErr.Error()); err != nil {
				return "", err
			}
			return "", callErr
		}
		if err := schema.CompleteOperation(finish, j.pool, inv.OperationID, result); err != nil {
			return "", err
		}
		return result, nil
	}
}
