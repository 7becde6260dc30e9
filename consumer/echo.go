package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/schema"
)

// Echo is the built-in agent for development and tests. It replies
// "echo: <content>" to each message of the turn. With Directives it also
// obeys directives on their own line:
//
//	/sleep <duration>    the model call takes that long
//	/fail                the model call fails
//	/tool lookup <text>  calls the read-only lookup tool
//	/tool NAME <text>    calls any other tool of the turn, such as the
//	                     side-effecting notify or an MCP server's
//	                     NAME__TOOL, with {"text": <text>}
//
// The directives run in order: the calls of /tool lines in a row are one
// step, and a /sleep or /fail after them runs in the next step, once they
// returned. The reply shows each call's answer, or why it failed or was
// not made, as "[NAME: answer]", as a model would read it.
type Echo struct {
	// Directives makes the agent obey /sleep, /fail and /tool. Off, those
	// lines are echoed like any other: anyone who may post a message
	// could otherwise hold a turn for as long as they like, fail turns on
	// purpose or run tools. Defaults to off; development and tests turn it
	// on.
	Directives bool
}

// ErrEchoFail is the failure the /fail directive asks for.
var ErrEchoFail = errors.New("echo: the model call failed (/fail directive)")

// Step answers one step: it reads the turn's directives from the start,
// skips those that earlier steps ran, and runs the rest up to the next
// calls, which it returns; with none left, it returns the reply.
func (e Echo) Step(ctx context.Context, req StepRequest) (Step, error) {
	var results []ToolResult
	for _, s := range req.Steps {
		results = append(results, s.Results...)
	}
	var out []string
	var calls []ToolCall
	// seen counts the /tool lines read so far: a directive before the
	// last call made ran in an earlier step.
	seen := 0
	for _, m := range req.Turn.Messages {
		var text []string
		for _, line := range strings.Split(m.Content, "\n") {
			directive := strings.Fields(line)
			if !e.Directives || len(directive) == 0 || !strings.HasPrefix(directive[0], "/") {
				text = append(text, line)
				continue
			}
			if directive[0] != "/tool" && directive[0] != "/sleep" && directive[0] != "/fail" {
				text = append(text, line)
				continue
			}
			if directive[0] != "/tool" {
				if seen < len(results) {
					continue
				}
				if len(calls) > 0 {
					// Runs once the calls before it returned.
					return Step{Calls: calls}, nil
				}
				if err := echoDirective(ctx, directive, line); err != nil {
					return Step{}, err
				}
				continue
			}
			if len(directive) < 2 {
				return Step{}, fmt.Errorf("echo: %q: write /tool NAME <text>, such as /tool lookup hello", line)
			}
			seen++
			if seen <= len(results) {
				r := results[seen-1]
				answer := r.Output
				if r.Error != "" {
					answer = r.Error
				}
				out = append(out, fmt.Sprintf("[%s: %s]", directive[1], answer))
				continue
			}
			arg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "/tool "+directive[1]))
			args, _ := json.Marshal(map[string]string{"text": arg})
			calls = append(calls, ToolCall{ID: "call_" + strconv.Itoa(seen), Tool: directive[1], Arguments: args})
		}
		out = append(out, "echo: "+strings.TrimSpace(strings.Join(text, "\n")))
	}
	if seen < len(results) {
		return Step{}, fmt.Errorf("echo: the turn made %d calls, %d more than its messages make: its steps are not its messages'", len(results), len(results)-seen)
	}
	if len(calls) > 0 {
		return Step{Calls: calls}, nil
	}
	return Step{Text: strings.Join(out, "\n")}, nil
}

// echoDirective runs /sleep or /fail.
func echoDirective(ctx context.Context, directive []string, line string) error {
	if directive[0] == "/fail" {
		return ErrEchoFail
	}
	if len(directive) != 2 {
		return fmt.Errorf("echo: %q: write /sleep <duration>, such as /sleep 2s", line)
	}
	d, err := time.ParseDuration(directive[1])
	if err != nil {
		return fmt.Errorf("echo: %q: %w", line, err)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// textArgument reads {"text": ...}.
func textArgument(raw json.RawMessage) (string, error) {
	var a struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return "", fmt.Errorf("arguments are not {\"text\": ...}: %w", err)
	}
	return a.Text, nil
}

// LookupTool is the echo agent's read-only tool: it reads and changes
// nothing, so recovery may run it again.
type LookupTool struct{}

func (LookupTool) Name() string    { return "lookup" }
func (LookupTool) Version() string { return "1" }
func (LookupTool) Effect() Effect  { return EffectRead }

func (LookupTool) Call(_ context.Context, inv Invocation) (string, error) {
	text, err := textArgument(inv.Arguments)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%q has %d characters", text, len([]rune(text))), nil
}

// NotifyTool is the echo agent's side-effecting tool: each execution
// appends one tool_side_effects row, so a repeated side effect is
// countable.
type NotifyTool struct {
	DB schema.Executor
}

func (NotifyTool) Name() string    { return "notify" }
func (NotifyTool) Version() string { return "1" }
func (NotifyTool) Effect() Effect  { return EffectWrite }

func (n NotifyTool) Call(ctx context.Context, inv Invocation) (string, error) {
	text, err := textArgument(inv.Arguments)
	if err != nil {
		return "", err
	}
	if err := schema.RecordSideEffect(ctx, n.DB, inv.OperationID, inv.IdempotencyKey, inv.ConversationID, text); err != nil {
		return "", fmt.Errorf("notify: %w", err)
	}
	return "notified", nil
}
