package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// clientResult is what read.mjs prints: the message the AI SDK's client
// ends with.
type clientResult struct {
	ID   string `json:"id"`
	Text string `json:"text"`
	// Reasoning is what the message's reasoning parts hold; Parts the
	// types of its parts, in order.
	Reasoning string          `json:"reasoning"`
	Parts     []string        `json:"parts"`
	Metadata  json.RawMessage `json:"metadata"`
	Deltas    int             `json:"deltas"`
}

// sdkStack is Baton in one process (relay, a worker whose agent is the
// fake model server and whose MCP server "mail" waits for approval, an
// API) over PostgreSQL and NATS, for the AI SDK's clients in Node.
type sdkStack struct {
	db   *testenv.DB
	api  *httptest.Server
	mail *agenttest.MCPServer
	// token is the user's, user their id.
	token string
	user  int64
	dir   string
}

func startSDKStack(t *testing.T) *sdkStack {
	t.Helper()
	s := &sdkStack{dir: filepath.Join(repoDir(), "internal", "e2e", "aisdk")}
	npmReady(t, s.dir)
	ctx, cancel := context.WithCancel(context.Background())
	s.db = testenv.Database(t)
	ns := testenv.StartNATS(t)
	nc, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	model := agenttest.NewResponder(t, chatModel)
	a, err := agent.NewOpenAI(agent.Config{BaseURL: model.BaseURL(), Model: "test"})
	require.NoError(t, err)
	s.mail = agenttest.NewMCPServer(t)
	mcp, err := agent.NewMCP(agent.MCPConfig{Servers: []agent.MCPServer{{Name: "mail", URL: s.mail.URL}}, Approve: []string{"mail"}, AllowPrivate: true}, s.db.Pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mcp.Close() })
	done := make(chan error, 1)
	go func() {
		done <- cli.RunStack(ctx, cli.StackConfig{
			Relay:  relay.Config{Slot: "slot_" + s.db.Name, Publication: "pub_" + s.db.Name},
			Worker: consumer.Config{Agent: a, ToolSource: mcp},
		}, s.db.Pool, nc)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	token, user, err := schema.CreateToken(ctx, s.db.Pool, "sdk")
	require.NoError(t, err)
	s.token, s.user = token, user.ID
	srv, err := api.New(api.Config{MessagesPerMinute: 10000, MessageBurst: 1000}, s.db.Pool, js)
	require.NoError(t, err)
	s.api = httptest.NewServer(srv)
	t.Cleanup(s.api.Close)
	t.Cleanup(srv.Close)
	return s
}

// run runs read.mjs with the major version of ai, a scenario and its
// arguments, and decodes what it printed into out.
func (s *sdkStack) run(t *testing.T, out any, version, scenario, chat, text string, more ...string) {
	t.Helper()
	cmd := exec.Command("node", append([]string{"read.mjs", version, scenario, s.api.URL, s.token, chat, chat + "-m1", text}, more...)...)
	cmd.Dir = s.dir
	stdout, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "node read.mjs %s %s: %s", version, scenario, stderr)
	require.NoError(t, json.Unmarshal(stdout, out), "%s", stdout)
}

// TestTheAISDKClientsOfBothMajorsReadBatonsStreams: the DefaultChatTransport
// and readUIMessageStream of ai 6 and ai 7, unchanged, read a reply, a
// resumed reply (a second client reconnecting mid-reply), a stopped reply
// and a reply whose model showed its reasoning (a reasoning part, then
// the text part); each ends with the reply as Baton stored it, under the
// id the history gives it, the same for both majors.
func TestTheAISDKClientsOfBothMajorsReadBatonsStreams(t *testing.T) {
	t.Parallel()
	s := startSDKStack(t)
	ctx := context.Background()
	run := func(t *testing.T, version, scenario, chat, text string) map[string]clientResult {
		t.Helper()
		var res map[string]clientResult
		s.run(t, &res, version, scenario, chat, text)
		return res
	}
	stored := func(t *testing.T, chat string) (id, content, reasoning string, stopped bool) {
		t.Helper()
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT m.id, m.content, coalesce(m.reasoning, ''), m.stopped FROM messages m JOIN conversations c ON c.id = m.conversation_id
			WHERE c.owner_id = $1 AND c.public_id = $2 AND m.role = 'assistant'`, s.user, chat).Scan(&id, &content, &reasoning, &stopped))
		return id, content, reasoning, stopped
	}

	texts := map[string]map[string]string{} // scenario -> version -> text
	for _, scenario := range []struct{ name, script, text string }{
		{"reply", "reply", "the same question"}, {"resume", "resume", "slow 60"}, {"stop", "stop", "slow 400"}, {"think", "reply", "think twice"},
	} {
		texts[scenario.name] = map[string]string{}
		for _, version := range []string{"v6", "v7"} {
			chat := fmt.Sprintf("%s-%s", scenario.name, version)
			res := run(t, version, scenario.script, chat, scenario.text)
			id, content, reasoning, stopped := stored(t, chat)
			reply := res["reply"]
			require.Equal(t, id, reply.ID, "%s %s: the client's message has the stored reply's id", version, scenario.name)
			require.Equal(t, content, reply.Text, "%s %s: the client ends with the stored reply", version, scenario.name)
			require.Equal(t, reasoning, reply.Reasoning, "%s %s: and its stored reasoning", version, scenario.name)
			texts[scenario.name][version] = reply.Text
			switch scenario.name {
			case "reply":
				require.Equal(t, "echo: the same question", reply.Text)
				require.Equal(t, "null", string(reply.Metadata))
				require.Equal(t, []string{"step-start", "text"}, reply.Parts)
			case "think":
				require.Equal(t, "The user wants a second thought; give one.", reply.Reasoning)
				require.Equal(t, "On second thought: yes.", reply.Text, "no reasoning in the text")
				require.Equal(t, []string{"step-start", "reasoning", "text"}, reply.Parts, "%s: a reasoning part, then the text part", version)
			case "resume":
				require.Equal(t, agenttest.Steady(60, 0).Content, reply.Text)
				resumed := res["resumed"]
				require.Equal(t, reply, clientResult{ID: resumed.ID, Text: resumed.Text, Reasoning: resumed.Reasoning, Parts: resumed.Parts,
					Metadata: resumed.Metadata, Deltas: reply.Deltas}, "%s: the resumed reply is the same message", version)
			case "stop":
				require.True(t, stopped)
				require.JSONEq(t, `{"stopped":true}`, string(reply.Metadata), "%s: the finish says the reply was stopped", version)
				require.NotContains(t, reply.Text, "w400", "stopped mid-reply")
			}
		}
	}
	require.Equal(t, texts["reply"]["v6"], texts["reply"]["v7"])
	require.Equal(t, texts["resume"]["v6"], texts["resume"]["v7"])
	require.Equal(t, texts["think"]["v6"], texts["think"]["v7"])
}

// approvalResult is what read.mjs prints for the approval scenario: the
// reply that asked, and the reply once the answer was sent.
type approvalResult struct {
	Asked struct {
		ID         string          `json:"id"`
		Text       string          `json:"text"`
		Tool       string          `json:"tool"`
		Input      json.RawMessage `json:"input"`
		ApprovalID string          `json:"approvalId"`
		Type       string          `json:"type"`
	} `json:"asked"`
	Final struct {
		ID       string `json:"id"`
		Text     string `json:"text"`
		Messages int    `json:"messages"`
		Tools    []struct {
			ToolCallID string  `json:"toolCallId"`
			State      string  `json:"state"`
			Output     *string `json:"output"`
		} `json:"tools"`
	} `json:"final"`
}

// TestTheAISDKChatOfBothMajorsAsksForAnApprovalAndSendsTheAnswer: the
// Chat of ai 6 and ai 7 (useChat's core) reads a turn that waits for
// approval as a tool part in state approval-requested, under Baton's
// approval id; addToolApprovalResponse, sent by the Chat itself as useChat
// sends it, decides the approval; the same reply goes on to Baton's stored
// reply, with the call's output (approved, sent once) or denied (never
// sent), and no text twice.
func TestTheAISDKChatOfBothMajorsAsksForAnApprovalAndSendsTheAnswer(t *testing.T) {
	t.Parallel()
	s := startSDKStack(t)
	ctx := context.Background()
	for _, version := range []string{"v6", "v7"} {
		for _, decision := range []string{"approve", "deny"} {
			chat := "mail-" + version + "-" + decision
			var res approvalResult
			s.run(t, &res, version, "approval", chat, "mail bob", decision)
			var approvalID, status, content, replyID string
			require.NoError(t, s.db.Pool.QueryRow(ctx, `
				SELECT a.public_id, a.status, m.content, m.id FROM approvals a JOIN conversations c ON c.id = a.conversation_id
				JOIN messages m ON m.conversation_id = c.id AND m.role = 'assistant'
				WHERE c.owner_id = $1 AND c.public_id = $2`, s.user, chat).Scan(&approvalID, &status, &content, &replyID))
			require.Equal(t, approvalID, res.Asked.ApprovalID, "%s: the client holds Baton's approval id", chat)
			require.Equal(t, "mail__send", res.Asked.Tool)
			require.Equal(t, "dynamic-tool", res.Asked.Type)
			require.JSONEq(t, `{"to":"bob"}`, string(res.Asked.Input))
			require.Equal(t, "Checking.", res.Asked.Text)
			require.Equal(t, replyID, res.Asked.ID, "%s: the reply that asked has the stored reply's id", chat)
			require.Equal(t, replyID, res.Final.ID, "%s: the answer goes on with the same reply", chat)
			require.Equal(t, 2, res.Final.Messages, "%s: the user's message and one reply", chat)
			require.Equal(t, content, res.Final.Text, "%s: the client ends with the stored reply, no text twice", chat)
			require.Len(t, res.Final.Tools, 1, chat)
			switch decision {
			case "approve":
				require.Equal(t, schema.ApprovalApproved, status)
				require.Equal(t, "output-available", res.Final.Tools[0].State, chat)
				require.Equal(t, `sent {"to":"bob"}`, *res.Final.Tools[0].Output)
				require.Equal(t, "Checking.\n\nSent.", content)
			case "deny":
				require.Equal(t, schema.ApprovalDenied, status)
				require.Equal(t, "output-denied", res.Final.Tools[0].State, chat)
				require.Equal(t, "Checking.\n\nNot sent.", content)
			}
		}
	}
	require.Len(t, s.mail.Calls(), 2, "each approved call was sent once, no denied one")
}
