package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// startA2AAgent runs the scripted A2A agent of testdata/a2a (the A2A
// JavaScript SDK's server, installed by `make test-deps`) and returns its
// origin once it listens.
func startA2AAgent(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: run `make test-deps` (scripts/install-deps.sh node, then npm ci in agent/testdata/a2a)")
	}
	dir, err := filepath.Abs("testdata/a2a")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules/@a2a-js/sdk")); err != nil {
		t.Fatalf("the A2A JavaScript SDK is not installed (%v): run `make test-deps`, which runs npm ci in agent/testdata/a2a", err)
	}
	cmd := exec.Command(node, "agent.mjs", "0")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr := &testenv.SyncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	ready := make(chan string, 1)
	go func() {
		defer close(exited)
		lines := bufio.NewScanner(stdout)
		if lines.Scan() {
			var hello struct{ URL string }
			_ = json.Unmarshal(lines.Bytes(), &hello)
			ready <- hello.URL
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
	}()
	select {
	case origin := <-ready:
		require.NotEmpty(t, origin, "the agent's first line names its URL")
		return origin
	case <-exited:
		t.Fatalf("the A2A agent exited before it listened: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the A2A agent did not listen within 30s: %s", stderr.String())
	}
	return ""
}

// a2aSeen is a JSON-RPC request the proxy passed on or answered.
type a2aSeen struct {
	method string
	header http.Header
	params json.RawMessage
}

// a2aFault is an answer the proxy gives instead of the agent.
type a2aFault struct {
	status int
	header http.Header
	body   string
}

// a2aProxy stands between Baton and the agent: it records each JSON-RPC
// request, and answers some itself (fault) or drops the A2A-Version
// header (strip).
type a2aProxy struct {
	*httptest.Server
	mu   sync.Mutex
	seen []a2aSeen
	// fault, when set, may answer the n-th call (from 0) of method.
	fault func(method string, n int) *a2aFault
	strip bool
}

func newA2AProxy(t *testing.T, origin string, change func(*a2aProxy)) *a2aProxy {
	t.Helper()
	target, err := url.Parse(origin)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	p := &a2aProxy{}
	if change != nil {
		change(p)
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var call struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		_ = json.Unmarshal(body, &call)
		p.mu.Lock()
		n := 0
		for _, s := range p.seen {
			if s.method == call.Method {
				n++
			}
		}
		p.seen = append(p.seen, a2aSeen{method: call.Method, header: r.Header.Clone(), params: call.Params})
		fault := p.fault
		p.mu.Unlock()
		if fault != nil {
			if f := fault(call.Method, n); f != nil {
				for k, vs := range f.header {
					w.Header()[k] = vs
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(f.status)
				_, _ = io.WriteString(w, f.body)
				return
			}
		}
		if p.strip {
			r.Header.Del("A2A-Version")
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// methods lists the JSON-RPC methods called so far, in order.
func (p *a2aProxy) methods() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, s := range p.seen {
		out = append(out, s.method)
	}
	return out
}

func (p *a2aProxy) calls() []a2aSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]a2aSeen(nil), p.seen...)
}

func count(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

// newA2A returns an A2A agent at proxy with short retry delays; change
// adjusts the configuration.
func newA2A(t testing.TB, proxy *a2aProxy, change func(*agent.ExternalConfig)) *agent.A2A {
	t.Helper()
	cfg := agent.ExternalConfig{
		Protocol:       agent.ProtocolA2A,
		URL:            proxy.URL + "/a2a",
		RetryBaseDelay: 10 * time.Millisecond,
		MaxRetryDelay:  time.Second,
		Timeout:        20 * time.Second,
	}
	if change != nil {
		change(&cfg)
	}
	a, err := agent.NewA2A(cfg)
	require.NoError(t, err)
	return a
}

// a2aTurn is a turn of one user message in conversation conv.
func a2aTurn(conv, content string) *consumer.Turn {
	return &consumer.Turn{
		ConversationID: conv, Owner: "u_1", RunID: "run_a2a", TurnID: "turn_" + conv, Attempt: 1,
		Messages: []schema.Message{{ID: "m1", ConversationID: conv, Role: schema.RoleUser, Content: content}},
	}
}

// signalLive records a step's live reply and signals each piece.
type signalLive struct {
	recordLive
	changed testenv.Signal
}

func (l *signalLive) Text(delta string) {
	l.recordLive.Text(delta)
	l.changed.Notify()
}

// tasksOf lists the agent's tasks of a context, asked of the agent itself.
func tasksOf(t *testing.T, origin, contextID string) []*a2a.Task {
	t.Helper()
	ctx := context.Background()
	c, err := a2aclient.NewFromEndpoints(ctx, []*a2a.AgentInterface{{URL: origin + "/a2a", ProtocolBinding: a2a.TransportProtocolJSONRPC, ProtocolVersion: a2a.Version}})
	require.NoError(t, err)
	res, err := c.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: contextID})
	require.NoError(t, err)
	return res.Tasks
}

func TestAnA2AAgentsArtifactStreamsLiveAndIsTheStepsText(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	auth := &authorizer{}
	a := newA2A(t, proxy, func(c *agent.ExternalConfig) {
		c.Authorizer = auth
		c.Headers = map[string]string{"X-Api-Key": "k-123456"}
	})
	turn := a2aTurn("c_stream", "reply It is sunny in Lima, 24 degrees.")
	live := &recordLive{}
	req := consumer.StepRequest{Turn: turn, Tools: []consumer.ToolSpec{weatherSpec}, Live: live}
	step, err := a.Step(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "It is sunny in Lima, 24 degrees.", step.Text)
	require.Empty(t, step.Calls, "an opaque agent's step asks for no tool")
	require.Greater(t, len(live.shown()), 3, "the artifact was shown piece by piece as it came")
	require.Equal(t, step.Text, strings.Join(live.shown(), ""))

	require.Equal(t, []string{"ListTasks", "SendStreamingMessage"}, proxy.methods(),
		"Baton looks for a task of the step's message before it sends it")
	key := req.Key()
	for _, c := range proxy.calls() {
		require.Equal(t, "1.0", c.header.Get("A2A-Version"), "every request names the A2A version")
		require.Equal(t, "Bearer tok."+key, c.header.Get("Authorization"))
		require.Equal(t, "k-123456", c.header.Get("X-Api-Key"))
	}
	var sent struct {
		Message struct {
			MessageID string `json:"messageId"`
			ContextID string `json:"contextId"`
			Role      string `json:"role"`
			Parts     []struct {
				Text string `json:"text"`
			} `json:"parts"`
			Metadata struct {
				Baton struct {
					RunID string `json:"runId"`
				} `json:"baton"`
			} `json:"metadata"`
		} `json:"message"`
	}
	require.NoError(t, json.Unmarshal(proxy.calls()[1].params, &sent))
	require.Equal(t, agent.A2AMessageID(key), sent.Message.MessageID, "the messageId derives from the step's key")
	require.Equal(t, "c_stream", sent.Message.ContextID, "the contextId is the conversation's server key")
	require.Equal(t, "ROLE_USER", sent.Message.Role)
	require.Len(t, sent.Message.Parts, 1)
	require.Equal(t, "reply It is sunny in Lima, 24 degrees.", sent.Message.Parts[0].Text, "no history: the agent keeps its own")
	require.Equal(t, key, sent.Message.Metadata.Baton.RunID)

	// An agent that answers in its final status message, with no
	// artifact.
	step, err = a.Step(context.Background(), consumer.StepRequest{Turn: a2aTurn("c_status", "status Done: the report is filed."), Live: live})
	require.NoError(t, err)
	require.Equal(t, "Done: the report is filed.", step.Text, "the status message of a task that completed without an artifact is the reply")
}

func TestAStepPostedAgainFollowsTheTaskOfItsMessageInsteadOfSendingItAgain(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	a := newA2A(t, proxy, nil)
	text := "one two three four five six seven eight nine ten"
	req := consumer.StepRequest{Turn: a2aTurn("c_again", "slow "+text)}

	// The first post: the worker dies once the agent started (its
	// context ends, as at a shutdown).
	live := &signalLive{}
	req.Live = live
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := a.Step(ctx, req)
		first <- err
	}()
	testenv.WaitFor(t, &live.changed, 10*time.Second, func() bool { return len(live.shown()) > 0 }, "the agent to start answering")
	cancel()
	require.ErrorIs(t, testenv.WaitOrTimeout(t, first, 10*time.Second, "the first post to end"), context.Canceled)
	require.NotContains(t, proxy.methods(), "CancelTask", "a step that may be posted again leaves its task running")

	// The same step, posted again.
	again := &recordLive{}
	req.Live = again
	step, err := a.Step(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, text, step.Text, "the second post returns the task's whole answer")
	require.Equal(t, text, strings.Join(again.shown(), ""), "and shows it")

	methods := proxy.methods()
	require.Equal(t, 1, count(methods, "SendStreamingMessage"), "the message was sent once: %v", methods)
	require.Equal(t, 2, count(methods, "ListTasks"), "each post looked for the message's task first: %v", methods)
	require.Positive(t, count(methods, "SubscribeToTask")+count(methods, "GetTask"), "the second post followed the task: %v", methods)
	tasks := tasksOf(t, origin, "c_again")
	require.Len(t, tasks, 1, "one task for the step, however often it was posted")
	require.Equal(t, a2a.TaskStateCompleted, tasks[0].Status.State)
}

func TestStopCancelsTheAgentsTask(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	a := newA2A(t, proxy, nil)
	live := &signalLive{}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.Step(ctx, consumer.StepRequest{Turn: a2aTurn("c_stop", "hang"), Live: live})
		done <- err
	}()
	testenv.WaitFor(t, &live.changed, 10*time.Second, func() bool { return len(live.shown()) > 0 }, "the agent to start working")
	cancel(consumer.ErrStopped)
	err := testenv.WaitOrTimeout(t, done, 10*time.Second, "the stopped step to end")
	require.ErrorIs(t, err, consumer.ErrStopped, "a stopped step returns its context's cause")
	require.Equal(t, []string{"thinking"}, live.shown(), "what the step showed stays")

	require.Equal(t, 1, count(proxy.methods(), "CancelTask"), "Stop sends CancelTask: %v", proxy.methods())
	tasks := tasksOf(t, origin, "c_stop")
	require.Len(t, tasks, 1)
	require.Equal(t, a2a.TaskStateCanceled, tasks[0].Status.State, "the agent canceled the task")
}

// TestATaskThatRequiresInputIsAQuestionWhoseAnswerGoesToTheTask: the
// agent's question is the step's, not a failure; the next step sends the
// person's answer as a message on the same task, which the agent then
// completes: one task in all.
func TestATaskThatRequiresInputIsAQuestionWhoseAnswerGoesToTheTask(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	a := newA2A(t, proxy, nil)
	turn := a2aTurn("c_ask", "ask Which Lima do you mean, Peru or Ohio?")
	st, err := a.Step(context.Background(), consumer.StepRequest{Turn: turn})
	require.NoError(t, err, "a question is not a failure")
	require.Len(t, st.Questions, 1)
	q := st.Questions[0]
	tasks := tasksOf(t, origin, "c_ask")
	require.Len(t, tasks, 1)
	require.Equal(t, a2a.TaskStateInputRequired, tasks[0].Status.State)
	require.Equal(t, string(tasks[0].ID), q.ID)
	require.Equal(t, "input_required", q.Reason)
	require.Equal(t, "Which Lima do you mean, Peru or Ohio?", q.Message)
	require.JSONEq(t, `{"taskId":"`+string(tasks[0].ID)+`","contextId":"c_ask"}`, string(q.Data), "the task its answer goes to")
	require.Equal(t, []string{"ListTasks", "SendStreamingMessage"}, proxy.methods())

	st.Questions[0].Status, st.Questions[0].Answer = schema.ApprovalApproved, json.RawMessage(`"reply Lima, Peru"`)
	next, err := a.Step(context.Background(), consumer.StepRequest{Turn: turn, Index: 1, Steps: []consumer.Step{st}})
	require.NoError(t, err)
	require.Equal(t, "Lima, Peru", next.Text, "the agent read the answer")
	tasks = tasksOf(t, origin, "c_ask")
	require.Len(t, tasks, 1, "the answer went to the task that asked, not to a new one")
	require.Equal(t, a2a.TaskStateCompleted, tasks[0].Status.State)
}

func TestATaskThatFailedOrWasRejectedFailsTheTurnAtOnce(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, nil)
	a := newA2A(t, proxy, nil)
	for _, c := range []struct {
		conv, text string
		kind       error
		says       string
	}{
		{"c_fail", "fail the booking service is down", agent.ErrAgentTaskFailed, `TASK_STATE_FAILED, saying "the booking service is down"`},
		{"c_reject", "reject", agent.ErrAgentRefused, `TASK_STATE_REJECTED, saying "I do not do that"`},
	} {
		_, err := a.Step(context.Background(), consumer.StepRequest{Turn: a2aTurn(c.conv, c.text)})
		require.ErrorIs(t, err, c.kind)
		require.True(t, consumer.IsTerminal(err), "another attempt would find the same task")
		require.Contains(t, err.Error(), c.says)
		var me *agent.ModelError
		require.ErrorAs(t, err, &me)
		require.NotEmpty(t, me.UserText())
	}
	require.Equal(t, 2, count(proxy.methods(), "SendStreamingMessage"), "one message each, not retried")
}

func TestAnAgentThatDoesNotTakeA2AVersionOneFailsAtOnceNamingTheSetting(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, func(p *a2aProxy) { p.strip = true })
	a := newA2A(t, proxy, nil)
	step, err := a.Step(context.Background(), consumer.StepRequest{Turn: a2aTurn("c_version", "reply hi")})
	require.ErrorIs(t, err, agent.ErrAgentRefused)
	require.True(t, consumer.IsTerminal(err))
	for _, want := range []string{"-32009", "A2A-Version", "--agent a2a", "--agent-url"} {
		require.Contains(t, err.Error(), want)
	}
	require.Equal(t, 1, step.Requests, "not retried")
	require.Equal(t, []string{"ListTasks"}, proxy.methods(), "the first refusal ends the step")
}

func TestA2ARequestsThatFailedAreRetriedAndMakeOneTask(t *testing.T) {
	t.Parallel()
	origin := startA2AAgent(t)
	proxy := newA2AProxy(t, origin, func(p *a2aProxy) {
		p.fault = func(method string, n int) *a2aFault {
			switch {
			case method == "SendStreamingMessage" && n == 0:
				return &a2aFault{status: http.StatusInternalServerError, body: `{"error":"upstream"}`}
			case method == "SendStreamingMessage" && n == 1:
				return &a2aFault{status: http.StatusTooManyRequests, header: http.Header{"Retry-After": {"0"}}, body: `{"error":"slow down"}`}
			}
			return nil
		}
	})
	a := newA2A(t, proxy, nil)
	step, err := a.Step(context.Background(), consumer.StepRequest{Turn: a2aTurn("c_retry", "reply fine after all")})
	require.NoError(t, err)
	require.Equal(t, "fine after all", step.Text)
	require.Equal(t, 3, step.Requests, "a 500 and a 429 with a short Retry-After were retried")
	require.Equal(t, 3, count(proxy.methods(), "ListTasks"), "each post looked for the task first")
	require.Len(t, tasksOf(t, origin, "c_retry"), 1)

	// A 401 is not retried.
	refused := newA2AProxy(t, origin, func(p *a2aProxy) {
		p.fault = func(string, int) *a2aFault {
			return &a2aFault{status: http.StatusUnauthorized, body: `{"error":"who are you"}`}
		}
	})
	_, err = newA2A(t, refused, nil).Step(context.Background(), consumer.StepRequest{Turn: a2aTurn("c_auth", "reply hi")})
	require.ErrorIs(t, err, agent.ErrAgentAuth)
	require.Len(t, refused.methods(), 1)
}

func TestNewA2ARefusesAnotherProtocolAndNewExternalRefusesA2A(t *testing.T) {
	t.Parallel()
	_, err := agent.NewA2A(agent.ExternalConfig{Protocol: agent.ProtocolAGUI, URL: "http://127.0.0.1:1/a2a"})
	require.ErrorContains(t, err, "NewExternal")
	_, err = agent.NewExternal(agent.ExternalConfig{Protocol: agent.ProtocolA2A, URL: "http://127.0.0.1:1/a2a"})
	require.ErrorContains(t, err, "NewA2A")
	_, err = agent.NewA2A(agent.ExternalConfig{URL: "http://127.0.0.1:1/a2a", Headers: map[string]string{"a2a-version": "0.3"}})
	require.ErrorContains(t, err, "Baton sets this header itself")
	require.False(t, errors.Is(err, agent.ErrAgentRefused))
}
