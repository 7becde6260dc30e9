package consumer

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// noTools fails every tool call: the echo agent without directives never
// makes one.
type noTools struct{}

func (noTools) Call(context.Context, ToolCall) (string, error) {
	return "", errors.New("no tool may run")
}

func TestEchoObeysDirectivesOnlyWhenTheyAreEnabled(t *testing.T) {
	t.Parallel()
	turn := Turn{Messages: []schema.Message{{Content: "/sleep 1000h\n/fail\n/tool notify hello\nplain"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, err := Loop{Agent: Echo{}, Executor: noTools{}}.Run(ctx, turn)
	require.NoError(t, err, "without directives nothing sleeps, fails or calls a tool")
	require.Equal(t, "echo: /sleep 1000h\n/fail\n/tool notify hello\nplain", reply.Content)

	_, err = Loop{Agent: Echo{Directives: true}, Executor: noTools{}}.Run(ctx, Turn{Messages: []schema.Message{{Content: "/fail"}}})
	require.ErrorIs(t, err, ErrEchoFail, "with directives, /fail fails")
}

// TestEchoRunsItsDirectivesInOrderAcrossSteps: a /fail after a call fails
// the turn only once the call returned, and a /sleep runs once, whatever
// the steps.
func TestEchoRunsItsDirectivesInOrderAcrossSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tools := &scriptedTools{answer: func(c ToolCall) (string, error) { return "ok", nil }}
	_, err := Loop{Agent: Echo{Directives: true}, Executor: tools, Tools: named("notify")}.Run(ctx,
		Turn{Messages: []schema.Message{{Content: "/tool notify a\n/fail"}}})
	require.ErrorIs(t, err, ErrEchoFail)
	require.Equal(t, []string{"call_1"}, tools.calls, "the call before /fail is made first")

	sleeps := &scriptedTools{answer: func(c ToolCall) (string, error) { return "ok", nil }}
	start := time.Now()
	reply, err := Loop{Agent: Echo{Directives: true}, Executor: sleeps, Tools: named("notify", "lookup")}.Run(ctx,
		Turn{Messages: []schema.Message{{Content: "/tool notify a\n/sleep 300ms\n/tool lookup b\n/tool lookup c\ndone"}}})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 600*time.Millisecond, "the sleep runs once")
	require.Equal(t, []string{"call_1", "call_2", "call_3"}, sleeps.calls)
	require.Equal(t, "[notify: ok]\n[lookup: ok]\n[lookup: ok]\necho: done", reply.Content)
}

// namedTool is a tool that only has a name: the tests' executors answer
// its calls.
type namedTool string

func (n namedTool) Name() string  { return string(n) }
func (namedTool) Version() string { return "1" }
func (namedTool) Effect() Effect  { return EffectRead }
func (namedTool) Call(context.Context, Invocation) (string, error) {
	return "", errors.New("the test's executor answers this tool")
}

// named is a set of tools with only names.
func named(names ...string) Tools {
	ts := Tools{}
	for _, n := range names {
		ts.Register(namedTool(n))
	}
	return ts
}

// TestADeployedDefaultWorkerEchoesDirectivesAsText runs `baton worker` as
// it is deployed, without --echo-directives: a user who sends /sleep 1000h
// gets it echoed at once instead of holding a turn for 1000 hours.
func TestADeployedDefaultWorkerEchoesDirectivesAsText(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	b := setup(t)
	b.Conversation("c")
	cmd := exec.Command(bin, "worker",
		"--database-url", b.DB.URL,
		"--nats-url", b.NATS.URL,
		"--stream", b.Stream.Name,
		"--subject-prefix", b.Stream.SubjectPrefix,
		"--partitions", strconv.Itoa(b.Stream.Partitions),
		"--debounce", "0",
		"--log-format", "json")
	logPath := filepath.Join(t.TempDir(), "worker.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	cmd.Stderr = logFile
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	b.Send("c", "m1", "/sleep 1000h")
	b.Eventually(60*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND content = 'echo: /sleep 1000h'`) == 1
	}, "the worker echoes /sleep 1000h as text (its log: %s)", logPath)
	b.Send("c", "m2", "/tool notify hello\n/fail")
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND content = E'echo: /tool notify hello\n/fail'`) == 1
	}, "the worker echoes /tool and /fail as text")
	require.Zero(t, b.Count(`SELECT count(*) FROM operations`), "no tool ran")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`), "no turn failed")
}

// scriptedTools answers each call with answer and records the ids of the
// calls made.
type scriptedTools struct {
	answer func(ToolCall) (string, error)
	calls  []string
}

func (s *scriptedTools) Call(_ context.Context, c ToolCall) (string, error) {
	s.calls = append(s.calls, c.ID)
	return s.answer(c)
}

// TestEchoStopsAtACallThatWaitsForApprovalAndResumesWithoutCallingAgain
// shows the echo agent on the journal's approval path: a call that waits
// stops the turn with the answers so far; the resumed turn reads those
// back, makes the decided call (which the journal answers by the
// decision) and goes on; a denied call is answered in the reply.
func TestEchoStopsAtACallThatWaitsForApprovalAndResumesWithoutCallingAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	echo := Echo{Directives: true}
	turn := Turn{Messages: []schema.Message{
		{Content: "first\n/tool s__ship one"},
		{Content: "second\n/tool s__refund two\n/tool lookup three"},
	}}
	asked := &scriptedTools{answer: func(c ToolCall) (string, error) {
		if c.Tool == "s__refund" {
			return "", ErrNeedsApproval
		}
		return "ok " + c.ID, nil
	}}
	tools := named("s__ship", "s__refund", "lookup")
	_, err := Loop{Agent: echo, Executor: asked, Tools: tools}.Run(ctx, turn)
	var stopped *Suspended
	require.ErrorAs(t, err, &stopped, "a call that waits for approval stops the turn")
	require.Equal(t, []string{"call_1", "call_2"}, asked.calls, "nothing after the waiting call runs")

	resume := func(status string, answer func(ToolCall) (string, error)) (Reply, []string, error) {
		exec := &scriptedTools{answer: answer}
		resume := &Resume{ApprovalID: "ap_1", ToolCallID: "call_2", Tool: "s__refund", Status: status, State: stopped.State}
		reply, err := Loop{Agent: echo, Executor: exec, Tools: tools, Resume: resume}.Run(ctx, turn)
		return reply, exec.calls, err
	}
	reply, calls, err := resume("approved", func(c ToolCall) (string, error) { return "done " + c.ID, nil })
	require.NoError(t, err)
	require.Equal(t, []string{"call_2", "call_3"}, calls, "the call made before the stop is not made again; the decided one and those after it are")
	require.Equal(t, "[s__ship: ok call_1]\necho: first\n[s__refund: done call_2]\n[lookup: done call_3]\necho: second", reply.Content)

	reply, _, err = resume("denied", func(c ToolCall) (string, error) {
		if c.ID == "call_2" {
			return "", &DeniedError{Tool: c.Tool, Status: schema.ApprovalDenied}
		}
		return "done " + c.ID, nil
	})
	require.NoError(t, err, "a denied call is an answer, not a failed turn")
	require.Contains(t, reply.Content, "[s__refund: the call of s__refund was not made: the user denied it.")
	require.Contains(t, reply.Content, "[lookup: done call_3]")

	turn.Messages = turn.Messages[:1]
	_, _, err = resume("approved", func(c ToolCall) (string, error) { return "done " + c.ID, nil })
	require.ErrorContains(t, err, "more than its messages make", "a state that does not match the turn's messages is refused")
}
