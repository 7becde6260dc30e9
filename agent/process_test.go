package agent_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// A real `baton worker --agent openai` process dies (like SIGKILL) right
// after its write tool completed and was journaled; a fresh worker goes on
// from the turn's journal: it asks the model for the next step, with the
// write's journaled result, and never runs the write again.
func TestAWorkerKilledAfterTheWriteToolGoesOnFromTheJournalWithoutRepeatingIt(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	s := newStack(t)
	hook := newReceiver(t)
	model := agenttest.NewServer(t,
		agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_hook", Name: "webhook", Arguments: `{"payload":{"ticket":"printer on fire"}}`}}},
		// Asked for once, by the worker that goes on after the crash.
		agenttest.Response{Content: "Ticket opened."},
	)

	cmd := exec.Command(bin, "worker", "--agent", "openai",
		"--model-base-url", model.BaseURL(), "--model", "test", "--model-api-key", "k",
		"--tool-webhook-url", hook.URL,
		"--database-url", s.db.URL, "--nats-url", s.nc.ConnectedUrl(),
		"--stream", s.stream.Name, "--subject-prefix", s.stream.SubjectPrefix,
		"--partitions", strconv.Itoa(s.stream.Partitions),
		"--lease", "1s", "--ack-wait", "1s", "--debounce", "0", "--log-format", "json", "--log-level", "debug",
		"--model-streaming=false")
	cmd.Env = append(os.Environ(), consumer.CrashEnv+"="+consumer.CrashAfterTool)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	s.send("conv-kill", "m1", "my printer is on fire, open a ticket")
	select {
	case err := <-exited:
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "worker ended with %v; stderr:\n%s", err, stderr.String())
		ws := ee.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the worker dies like SIGKILL after the tool; stderr:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker did not reach the crash point; stderr:\n%s", stderr.String())
	}
	deliveries, applied := hook.snapshot()
	require.NotEmpty(t, deliveries, "the write ran before the crash")

	reg, err := agent.Builtins{WebhookURL: hook.URL}.Registry()
	require.NoError(t, err)
	a := newAgent(t, model, nil)
	s.startWorker(a, reg, nil)
	replied := s.await("conv-kill", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, replied.Type, "the turn goes on from its journal")

	var content string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE id = $1 AND role = $2`, replied.MessageID, schema.RoleAssistant).Scan(&content))
	require.Equal(t, "Ticket opened.", content)
	require.Len(t, model.Requests(), 2, "the model is asked for the step after the write, not for the write again")
	require.Contains(t, model.Requests()[1].ToolMessages(), "call_hook", "the next step reads the write's journaled result")
	require.False(t, model.Requests()[0].Stream, "--model-streaming=false asks for whole answers")
	var agentLines int
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		require.LessOrEqual(t, strings.Count(line, `"component":`), 1, "a log line names its component once: %s", line)
		if strings.Contains(line, `"component":"agent"`) {
			agentLines++
		}
	}
	require.NotZero(t, agentLines, "the agent logged (its model request at debug level)")
	after, appliedAfter := hook.snapshot()
	require.Equal(t, deliveries, after, "the write was not sent again")
	require.Equal(t, applied, appliedAfter)
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM operations WHERE tool = 'webhook' AND effect = 'write'`))
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM operations o JOIN messages m ON m.id = o.message_id
		WHERE o.tool = 'webhook' AND o.status = 'completed' AND m.role = 'assistant' AND m.conversation_id = 'conv-kill'`), "the reply carries the write")
	require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = 'conv-kill' AND role = 'error'`))
}
