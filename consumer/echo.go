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
//	/tool notify <text>  calls the side-effecting notify tool
//	/tool NAME <text>    calls any other tool of the turn, such as an MCP
//	                     server's NAME__TOOL, with {"text": <text>}
//
// Every call goes through the journal. A call that waits for a person's
// approval stops the turn (Suspended) with the answers of the calls made
// before it; the resumed turn reads them back instead of calling again,
// and a call that was denied, expired or not sent after all is answered
// in the reply, as a model would read it.
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

// echoState is what the echo agent keeps when its turn stops for an
// approval: the answers of the calls made before the one that waits, in
// order.
type echoState struct {
	Results []string `json:"results"`
}

// Run answers the turn.
func (e Echo) Run(ctx context.Context, turn Turn, tools ToolExecutor) (Reply, error) {
	var out []string
	calls := 0
	// results are the answers of the turn's calls so far; saved are those
	// of a turn that stopped for an approval, which a resumed turn reads
	// back instead of calling again.
	var results, saved []string
	if r := turn.Resume; r != nil {
		var st echoState
		if err := json.Unmarshal(r.State, &st); err != nil {
			return Reply{}, fmt.Errorf("echo: read the state of the turn that waited for approval %s: %w", r.ApprovalID, err)
		}
		saved = st.Results
	}
	for _, m := range turn.Messages {
		var text []string
		for _, line := range strings.Split(m.Content, "\n") {
			directive := strings.Fields(line)
			if !e.Directives || len(directive) == 0 || !strings.HasPrefix(directive[0], "/") {
				text = append(text, line)
				continue
			}
			switch directive[0] {
			case "/sleep":
				if len(directive) != 2 {
					return Reply{}, fmt.Errorf("echo: %q: write /sleep <duration>, such as /sleep 2s", line)
				}
				d, err := time.ParseDuration(directive[1])
				if err != nil {
					return Reply{}, fmt.Errorf("echo: %q: %w", line, err)
				}
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return Reply{}, context.Cause(ctx)
				case <-t.C:
				}
			case "/fail":
				return Reply{}, ErrEchoFail
			case "/tool":
				if len(directive) < 2 {
					return Reply{}, fmt.Errorf("echo: %q: write /tool NAME <text>, such as /tool lookup hello", line)
				}
				calls++
				id := "call_" + strconv.Itoa(calls)
				if calls <= len(saved) {
					results = append(results, saved[calls-1])
					out = append(out, fmt.Sprintf("[%s: %s]", directive[1], saved[calls-1]))
					continue
				}
				if r := turn.Resume; r != nil && calls == len(saved)+1 && id != r.ToolCallID {
					return Reply{}, fmt.Errorf("echo: the turn that waited for approval %s stopped at call %s, but its messages make call %s there", r.ApprovalID, r.ToolCallID, id)
				}
				arg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "/tool "+directive[1]))
				args, _ := json.Marshal(map[string]string{"text": arg})
				res, err := tools.Call(ctx, ToolCall{ID: id, Tool: directive[1], Arguments: args})
				var denied *DeniedError
				var notSent *NotSentError
				switch {
				case errors.Is(err, ErrNeedsApproval):
					state, merr := json.Marshal(echoState{Results: results})
					if merr != nil {
						return Reply{}, merr
					}
					return Reply{}, &Suspended{State: state}
				case errors.As(err, &denied), errors.As(err, &notSent):
					res = err.Error()
				case err != nil:
					return Reply{}, err
				}
				results = append(results, res)
				out = append(out, fmt.Sprintf("[%s: %s]", directive[1], res))
			default:
				text = append(text, line)
			}
		}
		out = append(out, "echo: "+strings.TrimSpace(strings.Join(text, "\n")))
	}
	if r := turn.Resume; r != nil && calls <= len(saved) {
		return Reply{}, fmt.Errorf("echo: the turn that waited for approval %s stopped at call %s, which its messages do not make", r.ApprovalID, r.ToolCallID)
	}
	return Reply{Content: strings.Join(out, "\n")}, nil
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
