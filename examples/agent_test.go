package examples_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/secretscan"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/schema"
)

// agentExample is one of the example agents (examples/agent-ai-sdk,
// examples/agent-ag-ui) and what the test knows of its protocol.
type agentExample struct {
	// protocol is the worker's --agent.
	protocol string
	// dir is the example's folder under examples/.
	dir string
	// route is the path of the agent's one route.
	route string
	// garbledType and garbled are an answer that is not a stream of the
	// protocol, as an agent that gets its framing wrong sends it.
	garbledType, garbled string
	// notAStream is what the worker's log says of such an answer.
	notAStream string
	// request is a step request of the protocol that asks text, posted to
	// the agent directly.
	request func(conversation, turn, runID, text string) any
}

var agentExamples = []agentExample{{
	protocol: "ai-sdk", dir: "agent-ai-sdk", route: "/api/chat",
	// What result.toTextStreamResponse() answers, in place of the UI
	// message stream.
	garbledType: "text/plain; charset=utf-8", garbled: "You said: hello",
	notAStream: `the agent's answer is not a ai-sdk stream (it answered with \"text/plain; charset=utf-8\" instead of server-sent events)`,
	request: func(conversation, turn, runID, text string) any {
		return map[string]any{
			"id": conversation, "trigger": "submit-message",
			"messages": []any{map[string]any{"id": "m1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}}},
			"tools":    []any{},
			"baton":    map[string]any{"conversation": conversation, "turn": turn, "step": 0, "runId": runID, "attempt": 1, "epoch": 0},
		}
	},
}, {
	protocol: "ag-ui", dir: "agent-ag-ui", route: "/api/agent",
	// AG-UI events as JSON lines, without the "data:" of server-sent
	// events.
	garbledType: "text/event-stream",
	garbled:     `{"type":"RUN_STARTED","threadId":"t","runId":"r"}` + "\n" + `{"type":"TEXT_MESSAGE_CHUNK","messageId":"m","delta":"hello"}` + "\n",
	notAStream:  `the agent's answer is not a ag-ui stream (the answer is not server-sent events`,
	request: func(conversation, turn, runID, text string) any {
		return map[string]any{
			"threadId": conversation, "runId": runID, "protocolVersion": "1.0",
			"messages": []any{map[string]any{"id": "m1", "role": "user", "content": text}},
			"tools":    []any{}, "context": []any{}, "state": map[string]any{},
			"forwardedProps": map[string]any{"baton": map[string]any{"conversation": conversation, "turn": turn, "step": 0, "attempt": 1, "epoch": 0}},
		}
	},
}}

// The texts the agents write, as their scripts say.
const (
	slowly       = "Let me think about that slowly, one word at a time, so that the reply takes a while to arrive and can be stopped halfway through. Having thought it over, here is my answer: you said %q. That is all."
	userAuth     = "The assistant could not answer because it is not allowed to use its agent service. An administrator needs to fix it."
	userGarbled  = "The assistant could not answer because it could not read its agent service's answers. An administrator needs to fix it."
	refusedToken = "the agent refused Baton's credentials (401 Unauthorized)"
)

// TestTheExampleAgentsGetEveryGuaranteeOfBatonsLoop runs each example
// agent with node as its README runs it, behind real `baton relay`, `baton
// api` and `baton worker` processes, and drives conversations through the
// API as a client does. For each protocol: a reply streams before it is
// committed (read by the AI SDK's own client through /v1/chat); a declared
// write runs once although the worker is killed mid-step, the step being
// posted again with the same run id; Stop closes the open request and no
// step follows; a write that needs approval waits for it and goes on with
// its result; a 500 is retried as the same request; an answer that is not
// the protocol's stream and a token the agent refuses end the turn with a
// visible error, nothing half stored; and no process writes a key or a
// token.
func TestTheExampleAgentsGetEveryGuaranteeOfBatonsLoop(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed: run make test-deps")
	}
	for _, ex := range agentExamples {
		t.Run(ex.protocol, func(t *testing.T) {
			t.Parallel()
			s := startAgentStack(t, ex)
			t.Run("at once", func(t *testing.T) {
				for _, c := range []struct {
					name string
					run  func(*testing.T, *agentStack)
				}{
					{"a reply streams before it is committed", replyStreams},
					{"Stop closes the request and no step follows", stopClosesTheRequest},
					{"a write that needs approval waits and goes on", approvalRoundTrip},
					{"a 500 is retried as the same request", retriedAfterA500},
					{"an answer that is not the protocol fails visibly", garbledFailsVisibly},
					{"the agent refuses requests that Baton did not sign", agentRefusesForgedTokens},
				} {
					t.Run(c.name, func(t *testing.T) {
						t.Parallel()
						c.run(t, s)
					})
				}
			})
			// Each of these stops the worker: alone on the stack.
			t.Run("a write runs once across a worker killed mid-step", func(t *testing.T) { writeOnceAcrossAKill(t, s) })
			t.Run("a worker whose key the API does not serve fails visibly", func(t *testing.T) { strangerFailsVisibly(t, s) })
		})
	}
}

// agentStack is Baton as real processes (relay, API, worker) over a
// database and NATS of its own, in front of one example agent run with
// node, with a proxy between the worker and the agent, a webhook receiver
// and an MCP server for the worker's tools.
type agentStack struct {
	ex   agentExample
	repo string
	bin  string
	// dir is where Baton's processes run: the README's key files are there.
	dir string
	db  *testenv.DB
	// env is the environment of Baton's processes, agentEnv the agent's.
	env, agentEnv []string
	procs         proctest.Group
	apiURL        string
	// token is alice's, the user of every conversation.
	token string
	owner int64
	agent *proctest.Process
	// agentURL is the agent's route, reached directly.
	agentURL string
	proxy    *agentProxy
	tickets  *ticketDesk
	mail     *agenttest.MCPServer
	worker   *proctest.Process
	// keys are the secrets of the key pairs' private halves.
	keys []secretscan.Secret
	// sent numbers the messages sent, for their ids.
	sent atomic.Int64
}

func startAgentStack(t *testing.T, ex agentExample) *agentStack {
	t.Helper()
	s := &agentStack{ex: ex, repo: repoPath(t, "."), bin: testenv.BatonBinary(t), dir: t.TempDir(), db: testenv.Database(t)}
	for _, dir := range []string{ex.dir, "chat-usechat"} {
		_, err := os.Stat(filepath.Join(s.repo, "examples", dir, "node_modules", ".package-lock.json"))
		require.NoError(t, err, "the packages of examples/%s are not installed: run make test-deps", dir)
	}
	nats := testenv.StartNATS(t)
	var err error
	var user schema.User
	s.token, user, err = schema.CreateToken(context.Background(), s.db.Pool, "alice")
	require.NoError(t, err)
	s.owner = user.ID
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "BATON_") && !strings.HasPrefix(e, "AGENT_") && !strings.HasPrefix(e, "PORT=") {
			s.env = append(s.env, e)
		}
	}
	s.agentEnv = slices.Clone(s.env)
	s.env = append(s.env, "BATON_DATABASE_URL="+s.db.URL, "BATON_NATS_URL="+nats.URL, "BATON_LOG_FORMAT=json")
	// The README's lines that the test stands in for: make test-deps runs
	// npm ci, testenv migrates the database, and the test makes alice's
	// token and runs terminal.mjs itself, with the same variables.
	page := filepath.Join(s.repo, "examples", ex.dir, "README.md")
	for _, line := range []string{"npm ci --prefix examples/" + ex.dir, "bin/baton migrate", "bin/baton token create --user alice", "BATON_API="} {
		readmeLine(t, page, line)
	}
	require.Contains(t, readmeLine(t, page, "BATON_API="), "node examples/chat-usechat/terminal.mjs")
	s.tickets = newTicketDesk(t)
	s.mail = agenttest.NewMCPServer(t)
	s.proxy = newAgentProxy(t, ex)
	t.Cleanup(func() { s.stopAll(t) })

	// The worker's key pair, made as the README makes it, in the folder
	// Baton's processes run in; and a stranger's, which the API does not
	// serve.
	_, words := s.readme(t, "bin/baton agent-key create")
	s.run(t, words)
	_, err = jwtauth.CreateKeyPair(filepath.Join(s.dir, "stranger.pem"), filepath.Join(s.dir, "stranger.pub"), false)
	require.NoError(t, err)
	for _, key := range []string{flagOf(t, words, "--private-key"), "stranger.pem"} {
		s.keys = append(s.keys, privateKeySecrets(t, filepath.Join(s.dir, key))...)
	}

	// The README's processes, each started as soon as what it needs is
	// up: the relay and the API at once, the agent once the API has an
	// address, the worker once the relay made its stream.
	_, words = s.readme(t, "bin/baton relay")
	relay := s.baton(t, "relay", words, "--slot", "agents_"+s.db.Name, "--publication", "agents_"+s.db.Name)
	_, words = s.readme(t, "bin/baton api")
	api := s.baton(t, "api", words, "--http-addr", "127.0.0.1:0")
	addr := regexp.MustCompile(`"addr":"([^"]+)"`).FindStringSubmatch(api.WaitLine(t, 60*time.Second, `"serving HTTP API"`))
	s.apiURL = "http://" + addr[1]

	s.agent = s.startAgent(t, "agent", s.apiURL+"/.well-known/jwks.json")
	relay.WaitLine(t, 60*time.Second, `"connected; streaming"`)
	s.worker = s.startWorker(t, "worker", "")
	s.agentURL = agentRoute(t, s.agent, ex.route)
	s.proxy.to(t, s.agentURL)
	s.worker.WaitLine(t, 60*time.Second, `"worker started"`)
	return s
}

// startAgent starts the agent as the README does, with Baton's keys at
// jwksURL and, since the worker reaches it through the proxy, the proxy's
// origin as its audience.
func (s *agentStack) startAgent(t *testing.T, name, jwksURL string) *proctest.Process {
	t.Helper()
	vars, words := s.readme(t, "node examples/"+s.ex.dir+"/server.js")
	require.Contains(t, vars, "PORT")
	require.Contains(t, vars, "BATON_JWKS_URL")
	vars["PORT"] = "0"
	vars["BATON_JWKS_URL"] = jwksURL
	vars["AGENT_AUDIENCE"] = s.proxy.URL
	env := slices.Clone(s.agentEnv)
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return s.start(t, name, s.repo, env, words)
}

// agentRoute waits until the agent listens and returns the URL of its
// route.
func agentRoute(t *testing.T, agent *proctest.Process, route string) string {
	t.Helper()
	listening := agent.WaitLine(t, 60*time.Second, `"message":"listening"`)
	u := regexp.MustCompile(`"url":"([^"]+)"`).FindStringSubmatch(listening)[1]
	require.True(t, strings.HasSuffix(u, route), "the agent serves %s: %s", route, listening)
	return u
}

// readme returns the line of the example's README that runs command: its
// variables and its words.
func (s *agentStack) readme(t *testing.T, command string) (map[string]string, []string) {
	t.Helper()
	return readmeCommand(t, filepath.Join(s.repo, "examples", s.ex.dir, "README.md"), command)
}

// startWorker starts the README's worker with the stack's tools, signing
// with key (the README's when "").
func (s *agentStack) startWorker(t *testing.T, name, key string) *proctest.Process {
	t.Helper()
	_, words := s.readme(t, "bin/baton worker")
	agentURL, err := url.Parse(flagOf(t, words, "--agent-url"))
	require.NoError(t, err)
	require.Equal(t, s.ex.route, agentURL.Path, "the README's worker posts to the agent's route")
	words = setFlag(t, words, "--agent-url", s.proxy.URL+s.ex.route)
	words = setFlag(t, words, "--tool-webhook-url", s.tickets.URL+"/tickets")
	if key != "" {
		words = setFlag(t, words, "--agent-signing-key", key)
	}
	return s.baton(t, name, words, "--mcp-server", "mail="+s.mail.URL, "--mcp-approve", "mail", "--mcp-allow-private", "--debounce", "0")
}

// baton starts a README line of bin/baton with extra arguments.
func (s *agentStack) baton(t *testing.T, name string, words []string, extra ...string) *proctest.Process {
	t.Helper()
	require.Equal(t, "bin/baton", words[0])
	return s.start(t, name, s.dir, s.env, append(append([]string{s.bin}, words[1:]...), extra...))
}

// run runs a line of bin/baton to its end.
func (s *agentStack) run(t *testing.T, words []string) {
	t.Helper()
	p := s.baton(t, strings.Join(words[1:3], " "), words)
	require.Equal(t, 0, p.Wait(t, 30*time.Second), "%s fails; its last lines:\n%s", p.Name, p.Tail(10))
}

func (s *agentStack) start(t *testing.T, name, dir string, env, args []string) *proctest.Process {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Env = dir, env
	p, err := s.procs.Start(name, cmd, proctest.Options{Mask: func(line string) string { return secretscan.MaskAll(line, s.secrets()) }})
	require.NoError(t, err)
	return p
}

// secrets are what no process may write: the private keys, alice's token
// and the signatures of the step tokens the agent was sent.
func (s *agentStack) secrets() []secretscan.Secret {
	out := append(slices.Clone(s.keys), secretscan.Secret{Name: "user token", Value: s.token})
	for _, sig := range s.proxy.signatures() {
		out = append(out, secretscan.Secret{Name: "step token", Value: sig})
	}
	return out
}

// stopAll stops every process, shows their ends when the test failed, and
// fails it when one wrote a secret.
func (s *agentStack) stopAll(t *testing.T) {
	s.procs.StopAll(10 * time.Second)
	secrets := s.secrets()
	for _, p := range s.procs.All() {
		if t.Failed() {
			t.Logf("%s, its last lines:\n%s", p.Name, p.Tail(40))
		}
		out := p.Text("")
		for _, secret := range secrets {
			if secret.In(out) != "" {
				t.Errorf("%s wrote the %s", p.Name, secret.Name)
			}
		}
	}
}

// replyStreams: the AI SDK's client (useChat's transport) sends a message
// through /v1/chat; its first delta arrives while no reply is committed,
// more follow, and it ends with the reply as stored.
func replyStreams(t *testing.T, s *agentStack) {
	const chat, text = "streams", "think slowly about streams"
	cmd := []string{"node", "examples/chat-usechat/terminal.mjs", chat, text}
	env := append(slices.Clone(s.agentEnv), "BATON_API="+s.apiURL, "BATON_TOKEN="+s.token)
	c := s.start(t, "terminal.mjs", s.repo, env, cmd)
	c.WaitLine(t, 30*time.Second, `{"delta":`)
	require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id
		WHERE c.owner_id = $1 AND c.public_id = $2 AND m.role = 'assistant'`, s.owner, chat),
		"the first delta arrives before the reply is committed")
	require.Equal(t, 0, c.Wait(t, 60*time.Second), "terminal.mjs fails; its last lines:\n%s", c.Tail(10))
	var deltas int
	var reply struct {
		Reply struct{ ID, Text string } `json:"reply"`
	}
	for _, line := range strings.Split(strings.TrimSpace(c.Text("stdout")), "\n") {
		if strings.HasPrefix(line, `{"delta":`) {
			deltas++
		}
		require.NoError(t, json.Unmarshal([]byte(line), &reply), line)
	}
	require.Equal(t, fmt.Sprintf(slowly, text), reply.Reply.Text, "the client ends with the whole reply")
	require.Greater(t, deltas, 20, "the reply streamed word by word")
	msgs := s.messages(t, chat)
	last := msgs[len(msgs)-1]
	require.Equal(t, [3]string{"assistant", reply.Reply.ID, reply.Reply.Text}, [3]string{last.Role, last.ID, last.Content}, "the committed reply is the text the client read")
}

// stopClosesTheRequest: Stop while the reply streams closes the agent's
// request, the turn ends stopped with the text so far, and no further step
// of that turn is posted (the conversation's next turn is answered, by a
// step of its own).
func stopClosesTheRequest(t *testing.T, s *agentStack) {
	const text = "think slowly about stopping"
	w := s.watch(t, "stop")
	s.post(t, w, text)
	w.next(t, "delta")
	step := s.agent.WaitLine(t, 10*time.Second, `"message":"step request"`, `"conversation":"`+w.key+`"`)
	run := fieldOf(t, step, "run_id")
	var stopped struct{ Stopped bool }
	require.Equal(t, http.StatusOK, s.call(t, http.MethodPost, "/v1/conversations/stop/stop", nil, &stopped))
	require.True(t, stopped.Stopped)
	s.agent.WaitLine(t, 10*time.Second, `"request closed by the client"`, run)
	w.next(t, "stopped")
	msgs := s.messages(t, "stop")
	reply := msgs[len(msgs)-1]
	require.True(t, reply.Role == "assistant" && reply.Stopped, "the reply is kept, marked stopped: %+v", reply)
	require.True(t, strings.HasPrefix(fmt.Sprintf(slowly, text), reply.Content) && reply.Content != fmt.Sprintf(slowly, text),
		"the reply is the text written before the stop: %q", reply.Content)

	s.post(t, w, "and now?")
	w.next(t, "replied")
	require.Equal(t, "You said: and now?", s.lastReply(t, "stop"))
	steps := s.stepRequests(t, w.key)
	require.Len(t, steps, 2, "one request for the stopped turn, one for the next")
	require.NotEqual(t, steps[0].Turn, steps[1].Turn)
	require.Equal(t, run, steps[0].RunID)
}

// approvalRoundTrip: a call of an MCP write that needs approval makes the
// turn wait; approved through the API, it runs once, and the next step is
// posted with its result.
func approvalRoundTrip(t *testing.T, s *agentStack) {
	w := s.watch(t, "mail")
	s.post(t, w, `call mail__send {"to":"bob"}`)
	waiting := w.next(t, "waiting_for_approval")
	require.Equal(t, "mail__send", waiting.Tool)
	require.Empty(t, s.mail.Calls(), "nothing is sent before the approval")
	var list struct {
		Approvals []schema.Approval `json:"approvals"`
	}
	require.Equal(t, http.StatusOK, s.call(t, http.MethodGet, "/v1/conversations/mail/approvals", nil, &list))
	require.Len(t, list.Approvals, 1)
	a := list.Approvals[0]
	require.Equal(t, [2]string{waiting.ApprovalID, "pending"}, [2]string{a.ID, a.Status})
	require.JSONEq(t, `{"to":"bob"}`, string(a.Arguments))
	require.Equal(t, http.StatusOK, s.call(t, http.MethodPost, "/v1/conversations/mail/approvals/"+a.ID,
		map[string]any{"approved": true, "arguments_sha256": a.ArgumentsSHA256}, nil))
	w.next(t, "replied")
	require.Equal(t, `Done: mail__send answered sent {"to":"bob"}.`, s.lastReply(t, "mail"), "the agent's next step read the call's result")
	require.Equal(t, []string{`{"to":"bob"}`}, s.mail.Calls(), "the approved call ran once")
	steps := s.stepRequests(t, w.key)
	require.Len(t, steps, 2, "the step that asked, and the one with the result")
	require.Equal(t, [2]int{0, 1}, [2]int{steps[0].Step, steps[1].Step})
}

// retriedAfterA500: the first request of the step gets a 500 from the
// proxy; Baton posts the same request again, and the turn completes.
func retriedAfterA500(t *testing.T, s *agentStack) {
	w := s.watch(t, "flaky")
	s.proxy.fault(w.key, failFirst)
	s.post(t, w, "hello through a flaky proxy")
	w.next(t, "replied")
	require.Equal(t, "You said: hello through a flaky proxy", s.lastReply(t, "flaky"))
	steps := s.stepRequests(t, w.key)
	require.Len(t, steps, 1, "the agent saw the step once")
	require.Equal(t, 2, s.proxy.seen(steps[0].RunID), "the proxy saw the failed request and the retry, with the same run id")
}

// garbledFailsVisibly: an answer that is not a stream of the protocol
// ends the turn at once with the visible error, no reply stored.
func garbledFailsVisibly(t *testing.T, s *agentStack) {
	w := s.watch(t, "garbled")
	s.proxy.fault(w.key, garble)
	s.post(t, w, "hello")
	w.next(t, "failed")
	msgs := s.messages(t, "garbled")
	require.Len(t, msgs, 2, "the message and the error: %+v", msgs)
	require.Equal(t, "error", msgs[1].Role)
	require.True(t, strings.HasPrefix(msgs[1].Content, userGarbled), "the user reads why: %q", msgs[1].Content)
	s.worker.WaitLine(t, 10*time.Second, s.ex.notAStream)
	require.Len(t, s.proxy.runs(w.key), 1, "the turn fails at once, not retried")
}

// agentRefusesForgedTokens: a request to the agent without a token, with
// one signed by a key the API does not serve, for another audience or for
// another step gets 401; one signed as the worker signs gets its answer.
// An agent that cannot fetch Baton's keys answers 503 with Retry-After,
// which Baton waits out, never 401, which would fail the turn.
func agentRefusesForgedTokens(t *testing.T, s *agentStack) {
	cut := s.startAgent(t, "agent (without Baton's keys)", "http://127.0.0.1:1/.well-known/jwks.json")
	cutURL := agentRoute(t, cut, s.ex.route)
	worker, err := jwtauth.LoadSigningKey(filepath.Join(s.dir, "agent-signing-key.pem"))
	require.NoError(t, err)
	stranger, err := jwtauth.LoadSigningKey(filepath.Join(s.dir, "stranger.pem"))
	require.NoError(t, err)
	claims := jwtauth.StepClaims{Audience: s.proxy.URL, Subject: "alice", Conversation: "c_direct", Turn: "t1", Step: "step_direct", Expiry: time.Now().Add(time.Minute)}
	sign := func(k *jwtauth.SigningKey, c jwtauth.StepClaims) string {
		tok, err := k.Sign(c)
		require.NoError(t, err)
		return tok
	}
	otherAudience, otherStep := claims, claims
	otherAudience.Audience = "http://elsewhere.example"
	otherStep.Step = "step_other"
	for _, c := range []struct {
		name, agent, token string
		status             int
	}{
		{"no token", s.agentURL, "", http.StatusUnauthorized},
		{"a key the API does not serve", s.agentURL, sign(stranger, claims), http.StatusUnauthorized},
		{"another audience", s.agentURL, sign(worker, otherAudience), http.StatusUnauthorized},
		{"another step", s.agentURL, sign(worker, otherStep), http.StatusUnauthorized},
		{"signed as the worker signs", s.agentURL, sign(worker, claims), http.StatusOK},
		{"Baton's keys out of reach", cutURL, sign(worker, claims), http.StatusServiceUnavailable},
	} {
		body, err := json.Marshal(s.ex.request("c_direct", "t1", "step_direct", "hello"))
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, c.agent, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Idempotency-Key", "step_direct")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		answer, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, c.status, res.StatusCode, "%s: %s", c.name, answer)
		switch c.status {
		case http.StatusOK:
			require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
			require.Contains(t, string(answer), `"delta":"hello"`, "the agent answers a request signed as the worker signs")
		default:
			var refused struct{ Error struct{ Code string } }
			require.NoError(t, json.Unmarshal(answer, &refused), "%s: %s", c.name, answer)
			require.Equal(t, "application/json", res.Header.Get("Content-Type"), c.name)
			require.Equal(t, map[int]string{http.StatusUnauthorized: "unauthorized", http.StatusServiceUnavailable: "unavailable"}[c.status], refused.Error.Code, c.name)
		}
		if c.status == http.StatusServiceUnavailable {
			require.NotEmpty(t, res.Header.Get("Retry-After"), "%s: the agent says when to try again", c.name)
		}
	}
	cut.WaitLine(t, time.Second, `"cannot check a request's token"`)
	cut.Stop(10 * time.Second)
}

// writeOnceAcrossAKill: the ticket's step calls the webhook; the worker is
// killed while the next step's request is open; another worker posts that
// step again with the same run id, never the first, and the ticket is
// delivered once.
func writeOnceAcrossAKill(t *testing.T, s *agentStack) {
	const ticket = "the printer is on fire"
	w := s.watch(t, "ticket")
	s.post(t, w, "open a ticket: "+ticket+"\nthink slowly")
	first := fieldOf(t, s.agent.WaitLine(t, 30*time.Second, `"message":"step request"`, `"conversation":"`+w.key+`"`, `"step":0,`), "run_id")
	line := s.agent.WaitLine(t, 30*time.Second, `"message":"step request"`, `"conversation":"`+w.key+`"`, `"step":1,`)
	second := fieldOf(t, line, "run_id")
	s.worker.Kill()
	s.agent.WaitLine(t, 10*time.Second, `"request closed by the client"`, second)
	require.Equal(t, 1, s.tickets.deliveries(ticket), "the webhook ran in the first step")

	s.worker = s.startWorker(t, "worker (after the kill)", "")
	s.worker.WaitLine(t, 60*time.Second, `"worker started"`)
	w.next(t, "replied")
	require.Equal(t, `Let me think that over slowly, one word at a time. Done: webhook answered delivered (HTTP 200) {"ticket":"T-1"}.`, s.lastReply(t, "ticket"))
	require.Equal(t, 1, s.tickets.deliveries(ticket), "the ticket was delivered once")
	runs := map[string]int{}
	for _, step := range s.stepRequests(t, w.key) {
		runs[step.RunID]++
	}
	require.Equal(t, map[string]int{first: 1, second: 2}, runs, "the first step was posted once, the second again with the same run id")
	replies := testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant'`, w.key)
	require.Equal(t, 1, replies, "one reply")
}

// strangerFailsVisibly: a worker that signs with a key the API does not
// serve gets 401 from the agent, and the turn ends at once with a visible
// error; the worker's log says the agent refused Baton's credentials.
func strangerFailsVisibly(t *testing.T, s *agentStack) {
	s.worker.Stop(10 * time.Second)
	stranger := s.startWorker(t, "worker (stranger's key)", "stranger.pem")
	stranger.WaitLine(t, 60*time.Second, `"worker started"`)
	w := s.watch(t, "stranger")
	s.post(t, w, "hello")
	w.next(t, "failed")
	msgs := s.messages(t, "stranger")
	require.Len(t, msgs, 2, "the message and the error: %+v", msgs)
	require.True(t, msgs[1].Role == "error" && strings.HasPrefix(msgs[1].Content, userAuth), "the user reads why: %+v", msgs[1])
	stranger.WaitLine(t, 10*time.Second, refusedToken)
	runs := s.proxy.runs(w.key)
	require.Len(t, runs, 1, "the turn fails at once, not retried")
	s.agent.WaitLine(t, 10*time.Second, `"refused a request whose token does not come from Baton"`, "ERR_JWKS_NO_MATCHING_KEY", runs[0])
	require.Empty(t, s.stepRequests(t, w.key), "the agent answered no step")
}

// apiMessage is a message as GET /v1/conversations/{cid}/messages shows it.
type apiMessage struct {
	ID, Role, Content string
	Stopped           bool
}

func (s *agentStack) messages(t *testing.T, cid string) []apiMessage {
	t.Helper()
	var page struct{ Messages []apiMessage }
	require.Equal(t, http.StatusOK, s.call(t, http.MethodGet, "/v1/conversations/"+cid+"/messages", nil, &page))
	return page.Messages
}

// lastReply is the content of the conversation's last message, which must
// be a reply.
func (s *agentStack) lastReply(t *testing.T, cid string) string {
	t.Helper()
	msgs := s.messages(t, cid)
	last := msgs[len(msgs)-1]
	require.Equal(t, "assistant", last.Role, "the last message is a reply: %+v", msgs)
	return last.Content
}

// call makes a request of alice's to the API and decodes a 2xx answer
// into out.
func (s *agentStack) call(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.apiURL+path, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	if out != nil && res.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(b, out), "%s %s: %s", method, path, b)
	}
	return res.StatusCode
}

// post sends a message of alice's in the watched conversation.
func (s *agentStack) post(t *testing.T, w *conversationWatch, content string) {
	t.Helper()
	id := fmt.Sprintf("m%d", s.sent.Add(1))
	require.Equal(t, http.StatusAccepted, s.call(t, http.MethodPost, "/v1/conversations/"+w.cid+"/messages", map[string]string{"id": id, "content": content}, nil))
	w.next(t, "message")
}

// stepRequest is the agent's log line of one step request.
type stepRequest struct {
	Message      string `json:"message"`
	RunID        string `json:"run_id"`
	Idempotency  string `json:"idempotency_key"`
	Conversation string `json:"conversation"`
	Turn         string `json:"turn"`
	Step         int    `json:"step"`
}

// stepRequests are the step requests the agent logged for a conversation,
// in order; each says the same run id in its body and its Idempotency-Key.
func (s *agentStack) stepRequests(t *testing.T, conversation string) []stepRequest {
	t.Helper()
	var out []stepRequest
	for _, l := range s.agent.Output() {
		var r stepRequest
		if json.Unmarshal([]byte(l.Text), &r) != nil || r.Message != "step request" || r.Conversation != conversation {
			continue
		}
		require.Equal(t, r.RunID, r.Idempotency, "the run id and the Idempotency-Key agree: %s", l.Text)
		out = append(out, r)
	}
	return out
}

// conversationWatch is a conversation of alice's and its live events, read
// from GET /v1/conversations/{cid}/events as a client reads them.
type conversationWatch struct {
	cid, key string
	events   chan conversationEvent
}

type conversationEvent struct {
	// Name is the SSE event's name: "delta" for a live delta, "" for a
	// committed change, whose Type says which.
	Name       string
	Type       string `json:"type"`
	ApprovalID string `json:"approval_id"`
	Tool       string `json:"tool"`
}

// watch creates the conversation cid and follows its events until the
// test ends.
func (s *agentStack) watch(t *testing.T, cid string) *conversationWatch {
	t.Helper()
	require.Equal(t, http.StatusCreated, s.call(t, http.MethodPost, "/v1/conversations", map[string]string{"id": cid}, nil))
	w := &conversationWatch{cid: cid, events: make(chan conversationEvent, 1024)}
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT id FROM conversations WHERE owner_id = $1 AND public_id = $2`, s.owner, cid).Scan(&w.key))
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.apiURL+"/v1/conversations/"+cid+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		res.Body.Close()
		<-done
	})
	go func() {
		defer close(done)
		defer close(w.events)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(nil, 1<<20)
		var name string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev := conversationEvent{Name: name}
				if name == "" {
					_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev)
				}
				w.events <- ev
			case line == "":
				name = ""
			}
		}
	}()
	w.next(t, "ready")
	return w
}

// next waits for the next event named want ("delta", "ready") or of type
// want (a committed change), and returns it.
func (w *conversationWatch) next(t *testing.T, want string) conversationEvent {
	t.Helper()
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case ev, ok := <-w.events:
			require.True(t, ok, "the events of %s ended before %q; seen: %v", w.cid, want, seen)
			if ev.Name == want || ev.Name == "" && ev.Type == want {
				return ev
			}
			seen = append(seen, ev.Name+ev.Type)
		case <-timer.C:
			t.Fatalf("after 60s, %s has had no %q event; seen: %v", w.cid, want, seen)
		}
	}
}

// Faults the proxy plays for a conversation.
const (
	// failFirst answers the first request of each step with a 500.
	failFirst = "fail first"
	// garble answers every request with what is not a stream of the
	// protocol.
	garble = "garble"
)

// agentProxy stands between the worker and the agent, as a load balancer
// would, counts the requests of each step (by Idempotency-Key) and
// conversation, and plays faults for the conversations the test names.
type agentProxy struct {
	*httptest.Server
	ex    agentExample
	proxy atomic.Pointer[httputil.ReverseProxy]

	mu    sync.Mutex
	byRun map[string]int
	// byConv are the run ids of each conversation's requests, in order.
	byConv map[string][]string
	faults map[string]string
	sigs   []string
}

func newAgentProxy(t *testing.T, ex agentExample) *agentProxy {
	p := &agentProxy{ex: ex, byRun: map[string]int{}, byConv: map[string][]string{}, faults: map[string]string{}}
	p.Server = httptest.NewServer(p)
	t.Cleanup(p.Close)
	return p
}

// to sends what the proxy passes on to the agent at agentURL.
func (p *agentProxy) to(t *testing.T, agentURL string) {
	target, err := url.Parse(agentURL)
	require.NoError(t, err)
	p.proxy.Store(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host}) },
		FlushInterval: -1,
		// A request its client gave up (Stop, a killed worker) is not an
		// error to print.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
	})
}

func (p *agentProxy) fault(conversation, fault string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[conversation] = fault
}

func (p *agentProxy) seen(run string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byRun[run]
}

// runs are the run ids of the conversation's requests, a retry's too.
func (p *agentProxy) runs(conversation string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.byConv[conversation])
}

func (p *agentProxy) signatures() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sigs)
}

func (p *agentProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	// Both protocols carry the step's identity under "baton": the AI
	// SDK's at the top, AG-UI's in forwardedProps.
	var ids struct {
		Baton struct {
			Conversation string `json:"conversation"`
		} `json:"baton"`
		ForwardedProps struct {
			Baton struct {
				Conversation string `json:"conversation"`
			} `json:"baton"`
		} `json:"forwardedProps"`
	}
	_ = json.Unmarshal(body, &ids)
	conversation := ids.Baton.Conversation + ids.ForwardedProps.Baton.Conversation
	run := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.byRun[run]++
	p.byConv[conversation] = append(p.byConv[conversation], run)
	n, fault := p.byRun[run], p.faults[conversation]
	if token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); strings.Count(token, ".") == 2 {
		p.sigs = append(p.sigs, token[strings.LastIndex(token, ".")+1:])
	}
	p.mu.Unlock()
	switch {
	case fault == failFirst && n == 1:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error": {"code": "internal", "message": "the agent's load balancer failed"}}`)
	case fault == garble:
		w.Header().Set("Content-Type", p.ex.garbledType)
		_, _ = io.WriteString(w, p.ex.garbled)
	case p.proxy.Load() == nil:
		http.Error(w, "the agent is not up yet", http.StatusBadGateway)
	default:
		p.proxy.Load().ServeHTTP(w, r)
	}
}

// ticketDesk is the webhook's receiver: a ticket system that counts the
// deliveries of each ticket and numbers the tickets it opens.
type ticketDesk struct {
	*httptest.Server
	mu sync.Mutex
	// byTicket counts deliveries by the ticket's text.
	byTicket map[string]int
	opened   int
}

func newTicketDesk(t *testing.T) *ticketDesk {
	d := &ticketDesk{byTicket: map[string]int{}}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Payload struct {
				Ticket string `json:"ticket"`
			} `json:"payload"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, "a JSON payload and an Idempotency-Key, please", http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.byTicket[body.Payload.Ticket]++
		d.opened++
		n := d.opened
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"ticket":"T-%d"}`, n)
	}))
	t.Cleanup(d.Close)
	return d
}

func (d *ticketDesk) deliveries(ticket string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byTicket[ticket]
}

// readmeCommand returns the one line of the ```sh blocks of a README that
// holds command: the variables it sets before it, and its words. The line
// holds no quotes, so that its words are its arguments.
func readmeCommand(t *testing.T, page, command string) (map[string]string, []string) {
	t.Helper()
	line := readmeLine(t, page, command)
	require.NotContains(t, line, `"`, "the test runs %q word by word", line)
	vars := map[string]string{}
	words := strings.Fields(line)
	for len(words) > 0 {
		name, value, ok := strings.Cut(words[0], "=")
		if !ok || strings.ToUpper(name) != name {
			break
		}
		vars[name] = value
		words = words[1:]
	}
	return vars, words
}

// readmeLine returns the one line of the ```sh blocks of a README that
// holds command.
func readmeLine(t *testing.T, page, command string) string {
	t.Helper()
	text, err := os.ReadFile(page)
	require.NoError(t, err)
	var found []string
	in := false
	for _, line := range strings.Split(string(text), "\n") {
		switch {
		case line == "```sh":
			in = true
		case line == "```":
			in = false
		case in && strings.Contains(line, command):
			found = append(found, line)
		}
	}
	require.Len(t, found, 1, "%s runs %q on one line", page, command)
	return found[0]
}

// flagOf returns the value of a flag among words.
func flagOf(t *testing.T, words []string, flag string) string {
	t.Helper()
	i := slices.Index(words, flag)
	require.True(t, i >= 0 && i+1 < len(words), "%v has %s", words, flag)
	return words[i+1]
}

// setFlag returns words with the value of a flag they have replaced.
func setFlag(t *testing.T, words []string, flag, value string) []string {
	t.Helper()
	flagOf(t, words, flag)
	out := slices.Clone(words)
	out[slices.Index(out, flag)+1] = value
	return out
}

// fieldOf is a string field of a JSON log line.
func fieldOf(t *testing.T, line, field string) string {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &v), line)
	s, ok := v[field].(string)
	require.True(t, ok && s != "", "%s has no %s", line, field)
	return s
}

// privateKeySecrets are the forms in which a private key file's key could
// be written out.
func privateKeySecrets(t *testing.T, path string) []secretscan.Secret {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	block, _ := pem.Decode(b)
	require.NotNil(t, block, "%s is PEM", path)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	seed := key.(ed25519.PrivateKey).Seed()
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	name := filepath.Base(path)
	return []secretscan.Secret{
		{Name: name + " seed, base64", Value: base64.StdEncoding.EncodeToString(seed)},
		{Name: name + " seed, base64url", Value: base64.RawURLEncoding.EncodeToString(seed)},
		{Name: name + " seed, hex", Value: hex.EncodeToString(seed)},
		{Name: name + " PEM body", Value: body[len(body)-44:]},
	}
}
