package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// workerProcess is a real `baton worker` with the OpenAI agent against
// model and the fault server f as MCP server "f".
type workerProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
	stderr *testenv.SyncBuffer
}

func (s *stack) startWorkerProcess(bin string, model *agenttest.Server, f *faultServer, extra ...string) *workerProcess {
	s.t.Helper()
	return s.startWorkerProcessURL(bin, model, f.endpoint(), extra...)
}

// startWorkerProcessURL is startWorkerProcess with MCP server "f" at url.
func (s *stack) startWorkerProcessURL(bin string, model *agenttest.Server, url string, extra ...string) *workerProcess {
	s.t.Helper()
	return s.startWorkerProcessEnv(bin, model, url, nil, extra...)
}

// startWorkerProcessEnv is startWorkerProcessURL with env added to the
// worker's environment.
func (s *stack) startWorkerProcessEnv(bin string, model *agenttest.Server, url string, env []string, extra ...string) *workerProcess {
	s.t.Helper()
	args := append([]string{"worker",
		"--database-url", s.db.URL,
		"--nats-url", s.nats.URL,
		"--stream", s.stream.Name,
		"--subject-prefix", s.stream.SubjectPrefix,
		"--partitions", strconv.Itoa(s.stream.Partitions),
		"--lease", "1s", "--ack-wait", "1s", "--debounce", "0",
		"--agent", "openai", "--model-base-url", model.BaseURL(), "--model", "test-model",
		"--mcp-server", "f=" + url, "--mcp-allow-private",
		"--log-format", "json"}, extra...)
	p := &workerProcess{cmd: exec.Command(bin, args...), exited: make(chan struct{}), stderr: &testenv.SyncBuffer{}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	require.NoError(s.t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	s.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// kill SIGKILLs the worker and waits until it is gone.
func (p *workerProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	testenv.WaitOrTimeout(t, p.exited, 10*time.Second, "the killed worker to exit")
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the worker died of SIGKILL, not before: %s", p.stderr.String())
}

// events subscribes to the conversation events that worker processes
// publish (the events stream is provisioned as the API does).
func (s *stack) events() <-chan batonnats.ConversationEvent {
	s.t.Helper()
	_, _, err := batonnats.ProvisionEventsStream(context.Background(), s.js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(s.t, err)
	out := make(chan batonnats.ConversationEvent, 256)
	sub, err := s.nc.Subscribe(batonnats.DefaultEventsPrefix+".>", func(m *natsclient.Msg) {
		var ev batonnats.ConversationEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			select {
			case out <- ev:
			default:
			}
		}
	})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(s.t, s.nc.Flush())
	return out
}

func awaitEvent(t *testing.T, events <-chan batonnats.ConversationEvent, conv string, want ...batonnats.EventType) batonnats.ConversationEvent {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.ConversationID != conv {
				continue
			}
			for _, w := range want {
				if ev.Type == w {
					return ev
				}
			}
		case <-timeout:
			t.Fatalf("conversation %s reached none of %v within 60s", conv, want)
		}
	}
}

// TestAWorkerKilledDuringAnMCPWriteNeverSendsItAgain kills a real worker
// while a side-effecting MCP call is in flight: the next worker recovers
// the turn as failed, visibly, and the call never arrives again.
func TestAWorkerKilledDuringAnMCPWriteNeverSendsItAgain(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	s := newStack(t)
	events := s.events()
	f := newFaultServer(t)
	model := agenttest.NewResponder(t, callOnce("f__slow", `{"text":"ship it"}`))

	a := s.startWorkerProcess(bin, model, f)
	s.send("c", "m1", "ship the order")
	testenv.WaitOrTimeout(t, f.arrived, 60*time.Second, "the write to reach the server; worker log:\n%s", a.stderr.String())
	a.kill(t)

	b := s.startWorkerProcess(bin, model, f)
	ev := awaitEvent(t, events, "c", batonnats.EventFailed, batonnats.EventReplied)
	require.Equal(t, batonnats.EventFailed, ev.Type, "a write interrupted in flight fails the turn: %s\nworker log:\n%s", s.describe("c"), b.stderr.String())
	require.Contains(t, s.errorText("c"), `"f__slow", which may have taken effect; it was not repeated`)
	close(f.release)
	total, perKey := f.count("slow")
	require.Equal(t, 1, total, "the call was sent once, by the killed worker only")
	require.Equal(t, 1, perKey, "every idempotency key at most once")
	require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM agent_outbox WHERE conversation_id = 'c' AND status <> 'error'`), "the turn ended")
}

// TestAWorkerKilledWhileATurnWaitsForApprovalChangesNothing kills a real
// worker after its turn stopped for an approval: nothing changes. The
// approval given later is resumed by a worker that dies before it sends
// the call, then by another, which runs the call once.
func TestAWorkerKilledWhileATurnWaitsForApprovalChangesNothing(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	s := newStack(t)
	events := s.events()
	f := newFaultServer(t)
	model := agenttest.NewResponder(t, callOnce("f__count", `{"text":"refund 20"}`))

	a := s.startWorkerProcess(bin, model, f, "--mcp-approve", "f")
	s.send("c", "m1", "refund me")
	ev := awaitEvent(t, events, "c", batonnats.EventWaitingForApproval, batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventWaitingForApproval, ev.Type, "worker log:\n%s", a.stderr.String())
	snapshot := func() string {
		var out string
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `
			SELECT json_build_object(
				'conversation', (SELECT json_build_object('run', run_id, 'lease', lease_expires_at, 'approval', approval_id) FROM conversations WHERE id = 'c'),
				'outbox', (SELECT json_agg(json_build_object('id', id, 'status', status, 'attempts', attempts, 'run', run_id) ORDER BY id) FROM agent_outbox WHERE conversation_id = 'c'),
				'runs', (SELECT json_agg(json_build_object('id', id, 'status', status) ORDER BY started_at) FROM agent_runs WHERE conversation_id = 'c'),
				'operations', (SELECT json_agg(json_build_object('id', id, 'status', status, 'run', run_id) ORDER BY id) FROM operations WHERE conversation_id = 'c'),
				'approvals', (SELECT json_agg(json_build_object('id', public_id, 'status', status) ORDER BY id) FROM approvals WHERE conversation_id = 'c'))::text`).Scan(&out))
		return out
	}
	before := snapshot()
	a.kill(t)
	require.Equal(t, before, snapshot(), "killing the worker of a turn that waits for approval changes nothing")
	total, _ := f.count("count")
	require.Zero(t, total)

	_, err := s.decide("c", ev.ApprovalID, true)
	require.NoError(t, err)
	// The worker that resumes the turn dies before it sends the call: the
	// next one resumes it again.
	crashing := s.startWorkerProcessEnv(bin, model, f.endpoint(), []string{consumer.CrashEnv + "=" + consumer.CrashDuringModel}, "--mcp-approve", "f")
	testenv.WaitOrTimeout(t, crashing.exited, 60*time.Second, "the resuming worker to crash at %s: %s", consumer.CrashDuringModel, crashing.stderr.String())
	total, _ = f.count("count")
	require.Zero(t, total, "the worker died before it sent the approved call")
	b := s.startWorkerProcess(bin, model, f, "--mcp-approve", "f")
	done := awaitEvent(t, events, "c", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, done.Type, "the approval resumes the turn on another worker: %s\nworker log:\n%s", s.describe("c"), b.stderr.String())
	total, perKey := f.count("count")
	require.Equal(t, 1, total, "the approved call ran once")
	require.Equal(t, 1, perKey)
}
