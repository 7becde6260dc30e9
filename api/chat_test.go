package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
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

// chatStack is PostgreSQL, NATS, the relay, a worker whose agent speaks to
// a fake model server, and two API servers over them (two processes of the
// API, as far as a client can tell), with a user.
type chatStack struct {
	*bundle
	other *httptest.Server // the second API
	nc    *natsclient.Conn
	model *agenttest.Server
	// mail is an MCP server whose calls wait for approval.
	mail *agenttest.MCPServer
}

// chatModel answers by the newest user message: "slow N" streams N words
// steadily, "tool" calls the clock and then answers, "fail" is refused
// (the turn fails at once), anything else is echoed in a few chunks.
func chatModel(n int, req agenttest.Request) agenttest.Response {
	last := req.LastUser()
	var words int
	if _, err := fmt.Sscanf(last, "slow %d", &words); err == nil && words > 0 {
		return agenttest.Steady(words, 20*time.Millisecond)
	}
	switch {
	case strings.HasPrefix(last, "tool"):
		if len(req.ToolMessages()) == 0 {
			return agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "clock", Arguments: `{"time_zone":"UTC"}`}}}
		}
		return agenttest.Response{Content: "It is now."}
	case strings.HasPrefix(last, "fail"):
		return agenttest.Response{Status: http.StatusUnauthorized, Body: `{"error":{"message":"invalid api key"}}`}
	case strings.HasPrefix(last, "mail"):
		// mail__send waits for approval (the stack's --mcp-approve).
		results := req.ToolMessages()
		if len(results) == 0 {
			// "mail NAME" sends to NAME: each test mails someone else,
			// so that parallel tests tell their calls apart.
			to, _ := json.Marshal(map[string]string{"to": strings.TrimSpace(strings.TrimPrefix(last, "mail"))})
			return agenttest.Response{Content: "Checking.", ToolCalls: []agenttest.ToolCall{{ID: "call_mail", Name: "mail__send", Arguments: string(to)}}}
		}
		if strings.Contains(results["call_mail"], "not made") {
			return agenttest.Response{Content: "Not sent."}
		}
		return agenttest.Response{Content: "Sent."}
	}
	return agenttest.Response{Content: "echo: " + last, ChunkSize: 4}
}

// thinker answers "think N" itself, as an agent whose model shows its
// reasoning does, through consumer.StepLive: N words of reasoning
// ("r1 r2 ..."), then N words of text ("t1 t2 ..."), a word every 10 ms.
// It hands every other message to model.
type thinker struct{ model consumer.Agent }

func (th thinker) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	msgs := req.Turn.Messages
	var n int
	if _, err := fmt.Sscanf(msgs[len(msgs)-1].Content, "think %d", &n); err != nil || n < 1 {
		return th.model.Step(ctx, req)
	}
	reasoning, text := words("r", n), words("t", n)
	for _, w := range []struct {
		show func(string)
		of   string
	}{{req.Live.Reasoning, reasoning}, {req.Live.Text, text}} {
		for i, word := range strings.SplitAfter(w.of, " ") {
			if i > 0 {
				select {
				case <-ctx.Done():
					return consumer.Step{}, context.Cause(ctx)
				case <-time.After(10 * time.Millisecond):
				}
			}
			w.show(word)
		}
	}
	return consumer.Step{Text: text, Reasoning: reasoning}, nil
}

// words is "<prefix>1 <prefix>2 ... <prefix>n".
func words(prefix string, n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return strings.Join(ws, " ")
}

func startChatStack(t *testing.T) *chatStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	nc, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	model := agenttest.NewResponder(t, chatModel)
	reg := agent.NewRegistry(agent.Clock(nil))
	a, err := agent.NewOpenAI(agent.Config{BaseURL: model.BaseURL(), Model: "test"})
	require.NoError(t, err)
	mail := agenttest.NewMCPServer(t)
	mcp, err := agent.NewMCP(agent.MCPConfig{Servers: []agent.MCPServer{{Name: "mail", URL: mail.URL}}, Approve: []string{"mail"}, AllowPrivate: true}, db.Pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mcp.Close() })
	done := make(chan error, 1)
	go func() {
		done <- cli.RunStack(ctx, cli.StackConfig{
			Relay: relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
			Worker: consumer.Config{Agent: thinker{model: a}, Tools: reg.Tools(), ToolSource: mcp, MaxAttempts: 2, Lease: 5 * time.Second,
				Debounce: 50 * time.Millisecond},
		}, db.Pool, nc)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	alice, aliceUser, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	bob, _, err := schema.CreateToken(ctx, db.Pool, "bob")
	require.NoError(t, err)
	serve := func() *httptest.Server {
		srv, err := api.New(api.Config{MaxStreamsPerUser: 64,
			MessagesPerMinute: 100000, MessageBurst: 10000, MaxContentBytes: 1024, MaxChatBodyBytes: 64 << 10, MaxChatMessages: 50}, db.Pool, js)
		require.NoError(t, err)
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		t.Cleanup(srv.Close)
		return hs
	}
	hs := serve()
	return &chatStack{
		bundle: &bundle{pool: db.Pool, srv: hs, alice: alice, bob: bob, aliceID: aliceUser.ID, client: hs.Client()},
		other:  serve(), nc: nc, model: model, mail: mail,
	}
}

// chatBody is useChat's request body for a new user message.
func chatBody(chatID, messageID, text string, extra ...map[string]any) map[string]any {
	body := map[string]any{
		"id":      chatID,
		"trigger": "submit-message",
		"messages": []any{
			map[string]any{"id": "earlier", "role": "user", "parts": []any{map[string]any{"type": "text", "text": "history the server ignores"}}},
			map[string]any{"id": "earlier-reply", "role": "assistant", "parts": []any{map[string]any{"type": "dynamic-tool", "toolName": "x", "state": "output-available"}}},
			map[string]any{"id": messageID, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}},
		},
	}
	for _, e := range extra {
		for k, v := range e {
			body[k] = v
		}
	}
	return body
}

// chunks reads a UI message stream.
type chunks struct {
	t    *testing.T
	resp *http.Response
	r    *bufio.Reader
	all  []map[string]any
	done bool
}

// openChat sends a request to a chat route of srv and returns its stream;
// it fails t unless the answer is a UI message stream.
func (s *chatStack) openChat(t *testing.T, srv *httptest.Server, method, path, token string, body any) *chunks {
	t.Helper()
	resp, err := send(srv, method, path, token, body)
	require.NoError(t, err)
	return streamOf(t, method, path, resp)
}

// send sends a request to srv.
func send(srv *httptest.Server, method, path, token string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	return srv.Client().Do(req)
}

// streamOf is the stream of a chat route's answer; it fails t unless the
// answer is a UI message stream.
func streamOf(t *testing.T, method, path string, resp *http.Response) *chunks {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	require.Equal(t, "v1", resp.Header.Get("x-vercel-ai-ui-message-stream"))
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	c := &chunks{t: t, resp: resp, r: bufio.NewReader(resp.Body)}
	t.Cleanup(func() { resp.Body.Close() })
	return c
}

// chunkWait bounds the wait for a stream's next chunk (keep-alive
// comments aside): a stream that stops before its end fails the test
// instead of holding it.
const chunkWait = time.Minute

// next returns the next chunk, or nil at [DONE].
func (c *chunks) next() map[string]any {
	c.t.Helper()
	cut := time.AfterFunc(chunkWait, func() { c.resp.Body.Close() })
	defer cut.Stop()
	for {
		line, err := c.r.ReadString('\n')
		require.NoError(c.t, err, "the stream ended before [DONE], or sent nothing for %s; chunks so far: %v", chunkWait, c.all)
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			c.done = true
			return nil
		}
		var ch map[string]any
		require.NoError(c.t, json.Unmarshal([]byte(data), &ch), data)
		c.all = append(c.all, ch)
		return ch
	}
}

// untilDeltas reads until n text deltas came.
func (c *chunks) untilDeltas(n int) {
	c.t.Helper()
	for c.count("text-delta") < n {
		require.NotNil(c.t, c.next(), "the stream ended after %d text deltas; want %d", c.count("text-delta"), n)
	}
}

// rest reads to [DONE].
func (c *chunks) rest() []map[string]any {
	c.t.Helper()
	for !c.done {
		c.next()
	}
	return c.all
}

func (c *chunks) count(typ string) int {
	n := 0
	for _, ch := range c.all {
		if ch["type"] == typ {
			n++
		}
	}
	return n
}

// text is what the text deltas add up to.
func (c *chunks) text() string { return c.deltas("text-delta") }

// reasoning is what the reasoning deltas add up to.
func (c *chunks) reasoning() string { return c.deltas("reasoning-delta") }

func (c *chunks) deltas(typ string) string {
	var b strings.Builder
	for _, ch := range c.all {
		if ch["type"] == typ {
			b.WriteString(ch["delta"].(string))
		}
	}
	return b.String()
}

func (c *chunks) first(typ string) map[string]any {
	for _, ch := range c.all {
		if ch["type"] == typ {
			return ch
		}
	}
	c.t.Fatalf("no %s chunk in %v", typ, c.all)
	return nil
}

func (c *chunks) types() []string {
	var out []string
	for _, ch := range c.all {
		out = append(out, ch["type"].(string))
	}
	return out
}

// history is the chat's history as UIMessages.
func (s *chatStack) history(t *testing.T, token, chatID string) []map[string]any {
	t.Helper()
	r := s.do(t, token, "GET", "/v1/chat/"+chatID, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var out []map[string]any
	for _, m := range r.Body["messages"].([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

func textOf(m map[string]any) string {
	var b strings.Builder
	for _, p := range m["parts"].([]any) {
		if p := p.(map[string]any); p["type"] == "text" {
			b.WriteString(p["text"].(string))
		}
	}
	return b.String()
}

func TestTheChatAdapter(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)

	// First, alone: nothing else writes while it counts rows.
	t.Run("bad bodies get a clear 4xx and write nothing", func(t *testing.T) {
		s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("used", "u1", "first words")).rest()
		many := make([]any, 51)
		for i := range many {
			many[i] = map[string]any{"id": fmt.Sprintf("m%d", i), "role": "user", "parts": []any{map[string]any{"type": "text", "text": "x"}}}
		}
		for _, tc := range []struct {
			name   string
			body   any
			status int
			says   string
		}{
			{"not JSON", "{", http.StatusBadRequest, "malformed JSON"},
			{"an array", "[]", http.StatusBadRequest, "JSON object"},
			{"no id", map[string]any{"messages": []any{}}, http.StatusBadRequest, "chat id is empty"},
			{"no messages", map[string]any{"id": "bad"}, http.StatusBadRequest, "messages"},
			{"last message the assistant's", map[string]any{"id": "bad", "messages": []any{map[string]any{"id": "a", "role": "assistant", "parts": []any{}}}}, http.StatusBadRequest, "user's new message"},
			{"a file part", map[string]any{"id": "bad", "messages": []any{map[string]any{"id": "a", "role": "user", "parts": []any{map[string]any{"type": "file", "url": "data:,x"}}}}}, http.StatusUnprocessableEntity, "only text parts"},
			{"no text", chatBody("bad", "a", "  "), http.StatusBadRequest, "no text"},
			{"text over the limit", chatBody("bad", "a", strings.Repeat("x", 1025)), http.StatusRequestEntityTooLarge, "limit is 1024"},
			{"body over the limit", chatBody("bad", "a", "x", map[string]any{"padding": strings.Repeat("x", 70<<10)}), http.StatusRequestEntityTooLarge, "over"},
			{"too many messages", map[string]any{"id": "bad", "messages": many}, http.StatusRequestEntityTooLarge, "more than 50"},
			{"a bad chat id", chatBody(" bad", "a", "x"), http.StatusBadRequest, "whitespace"},
			{"a bad message id", chatBody("bad", "", "x"), http.StatusBadRequest, "empty"},
			{"an unknown trigger", chatBody("bad", "a", "x", map[string]any{"trigger": "shout"}), http.StatusBadRequest, "trigger"},
			{"a regenerate of a chat that does not exist", chatBody("bad", "a", "x", map[string]any{"trigger": "regenerate-message"}), http.StatusNotFound, "no chat"},
			{"a message id used for other content", chatBody("used", "u1", "other words"), http.StatusConflict, "different content"},
		} {
			before := counts(t, s.pool)
			r := s.do(t, s.alice, "POST", "/v1/chat", tc.body)
			require.Equal(t, tc.status, r.Status, "%s: %s", tc.name, r.Raw)
			require.Contains(t, r.Raw, tc.says, tc.name)
			require.Equal(t, before, counts(t, s.pool), "%s: nothing written", tc.name)
		}
		for _, path := range []string{"/v1/chat/used?limit=0", "/v1/chat/used?before=x", "/v1/chat/%20x"} {
			r := s.do(t, s.alice, "GET", path, nil)
			require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", path, r.Raw)
		}
	})

	t.Run("a message streams in as useChat reads it, and the history has the reply under the same id", func(t *testing.T) {
		t.Parallel()
		c := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("plain", "p1", "hello there"))
		c.rest()
		require.Equal(t, "echo: hello there", c.text())
		types := c.types()
		require.Equal(t, []string{"start", "start-step", "text-start"}, types[:3])
		require.Equal(t, []string{"text-end", "finish-step", "finish"}, types[len(types)-3:])
		require.Equal(t, "stop", c.first("finish")["finishReason"])
		replyID := c.first("start")["messageId"].(string)
		require.True(t, strings.HasPrefix(replyID, "reply_"), replyID)
		h := s.history(t, s.alice, "plain")
		require.Len(t, h, 2)
		require.Equal(t, map[string]any{"id": "p1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": "hello there"}}}, h[0])
		require.Equal(t, replyID, h[1]["id"], "the stream's messageId is the history's")
		require.Equal(t, "echo: hello there", textOf(h[1]))

		again := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("plain", "p1", "hello there"))
		again.rest()
		require.Equal(t, replyID, again.first("start")["messageId"], "the same POST again attaches to the same turn")
		require.Equal(t, "echo: hello there", again.text())
		require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.public_id = 'plain'`), "and never starts a second one")
		// A worker's claim waits for the message's transaction on the
		// conversation's row; a conversation made in that same transaction
		// would have no row to wait on, and an early claim would take it
		// for deleted and drop the trigger.
		require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM conversations c JOIN messages m ON m.conversation_id = c.id
			WHERE c.public_id = 'plain' AND m.public_id = 'p1' AND c.xmin::text <> m.xmin::text`), "a new chat commits before its first message")
	})

	t.Run("two concurrent identical POSTs make one turn and both streams carry its reply", func(t *testing.T) {
		t.Parallel()
		var wg sync.WaitGroup
		resps, errs := make([]*http.Response, 2), make([]error, 2)
		for i := range resps {
			wg.Go(func() {
				resps[i], errs[i] = send(s.srv, "POST", "/v1/chat", s.alice, chatBody("twice", "t1", "slow 10"))
			})
		}
		wg.Wait()
		streams := make([]*chunks, 2)
		for i, c := range resps {
			require.NoError(t, errs[i])
			streams[i] = streamOf(t, "POST", "/v1/chat", c)
		}
		for _, c := range streams {
			c.rest()
			require.Equal(t, "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", c.text())
		}
		require.Equal(t, streams[0].first("start")["messageId"], streams[1].first("start")["messageId"])
		require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM agent_runs r JOIN conversations c ON c.id = r.conversation_id WHERE c.public_id = 'twice'`))
		require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id = 'twice' AND m.role = 'user'`))
	})

	t.Run("a message sent while a reply streams supersedes it, and both streams end with the reply that covers them", func(t *testing.T) {
		t.Parallel()
		first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("burst", "b1", "slow 300"))
		first.untilDeltas(2)
		second := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("burst", "b2", "slow 8"))
		second.rest()
		first.rest()
		want := agenttest.Steady(8, 0).Content
		require.Equal(t, want, second.text())
		require.True(t, strings.HasSuffix(first.text(), want), "the first stream ends with the reply too: %q", first.text())
		require.Equal(t, first.first("start")["messageId"], second.first("start")["messageId"], "one reply, one id")
		h := s.history(t, s.alice, "burst")
		require.Len(t, h, 3, "two messages, one reply")
		require.Equal(t, second.first("start")["messageId"], h[2]["id"])
		require.Equal(t, want, textOf(h[2]))
	})

	t.Run("a resumed stream from another API process shows the whole reply exactly once", func(t *testing.T) {
		t.Parallel()
		post := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("resumed", "r1", "slow 60"))
		post.untilDeltas(10)
		resumed := s.openChat(t, s.other, "GET", "/v1/chat/resumed/stream", s.alice, nil)
		resumed.rest()
		post.rest()
		want := agenttest.Steady(60, 0).Content
		require.Equal(t, want, post.text())
		require.Equal(t, want, resumed.text(), "the text so far, then live deltas: nothing twice, nothing skipped")
		require.Equal(t, post.first("start")["messageId"], resumed.first("start")["messageId"])
		require.Equal(t, 1, resumed.count("start"))
		require.Greater(t, resumed.count("text-delta"), 1, "the text so far came as one delta, then live ones")
		require.GreaterOrEqual(t, strings.Count(resumed.first("text-delta")["delta"].(string), "w"), 10,
			"the first delta is the text so far: the ten words the POST had shown at least")

		r := s.do(t, s.alice, "GET", "/v1/chat/resumed/stream", nil)
		require.Equal(t, http.StatusNoContent, r.Status, "nothing runs: nothing to resume")
	})

	t.Run("stop ends the turn with the partial reply, marked stopped, and no reply comes later", func(t *testing.T) {
		t.Parallel()
		post := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("stopped", "s1", "slow 500"))
		post.untilDeltas(5)
		r := s.do(t, s.alice, "POST", "/v1/conversations/stopped/stop", nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		require.Equal(t, true, r.Body["stopped"])
		post.rest()
		finish := post.first("finish")
		require.Equal(t, map[string]any{"stopped": true}, finish["messageMetadata"])
		h := s.history(t, s.alice, "stopped")
		require.Len(t, h, 2)
		require.Equal(t, map[string]any{"stopped": true}, h[1]["metadata"])
		require.Equal(t, textOf(h[1]), post.text(), "the stream ends with the reply as committed")
		require.NotEmpty(t, post.text())
		require.NotContains(t, post.text(), "w500", "stopped mid-reply")
		require.Equal(t, http.StatusNoContent, s.do(t, s.alice, "GET", "/v1/chat/stopped/stream", nil).Status)

		next := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("stopped", "s2", "after the stop"))
		next.rest()
		require.Equal(t, "echo: after the stop", next.text(), "a message after the stop starts a new turn")
		require.Len(t, s.history(t, s.alice, "stopped"), 4)
	})

	t.Run("regenerate answers again with a new reply, which replaces the old one in the history", func(t *testing.T) {
		t.Parallel()
		first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("regen", "g1", "say it"))
		first.rest()
		oldID := first.first("start")["messageId"]
		regen := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("regen", "g1", "say it",
			map[string]any{"trigger": "regenerate-message", "messageId": oldID}))
		regen.rest()
		newID := regen.first("start")["messageId"]
		require.NotEqual(t, oldID, newID)
		require.Equal(t, "echo: say it", regen.text())
		h := s.history(t, s.alice, "regen")
		require.Len(t, h, 2)
		require.Equal(t, newID, h[1]["id"])
		all := s.do(t, s.alice, "GET", convPath("regen", "/messages"), nil)
		require.Contains(t, all.Raw, `"superseded":true`, "the old reply is kept, marked superseded")

		running := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("regen", "g2", "slow 300"))
		running.untilDeltas(1)
		r := s.do(t, s.alice, "POST", "/v1/chat", chatBody("regen", "g2", "slow 300", map[string]any{"trigger": "regenerate-message"}))
		require.Equal(t, http.StatusConflict, r.Status, r.Raw)
		require.Contains(t, r.Raw, "running")
		require.Equal(t, http.StatusOK, s.do(t, s.alice, "POST", "/v1/conversations/regen/stop", nil).Status)
		running.rest()
	})

	t.Run("reasoning streams as reasoning chunks before the text, and the history and the messages keep it apart", func(t *testing.T) {
		t.Parallel()
		c := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("thinking", "th1", "think 6"))
		c.rest()
		require.Equal(t, "r1 r2 r3 r4 r5 r6", c.reasoning())
		require.Equal(t, "t1 t2 t3 t4 t5 t6", c.text(), "no reasoning in the text")
		types := slices.Compact(c.types())
		require.Equal(t, []string{"start", "start-step", "reasoning-start", "reasoning-delta", "reasoning-end",
			"text-start", "text-delta", "text-end", "finish-step", "finish"}, types)
		id := c.first("reasoning-start")["id"]
		for _, ch := range c.all {
			switch ch["type"] {
			case "reasoning-delta":
				require.Equal(t, []string{"delta", "id", "type"}, keys(ch), "the fields of the AI SDK's chunk")
				require.Equal(t, id, ch["id"], "every reasoning chunk names the part reasoning-start opened")
			case "reasoning-start", "reasoning-end":
				require.Equal(t, []string{"id", "type"}, keys(ch))
				require.Equal(t, id, ch["id"])
			}
		}
		require.NotEqual(t, id, c.first("text-start")["id"], "the text is another part")

		h := s.history(t, s.alice, "thinking")
		require.Len(t, h, 2)
		require.Equal(t, c.first("start")["messageId"], h[1]["id"])
		require.Equal(t, []any{
			map[string]any{"type": "step-start"},
			map[string]any{"type": "reasoning", "text": "r1 r2 r3 r4 r5 r6", "state": "done"},
			map[string]any{"type": "text", "text": "t1 t2 t3 t4 t5 t6", "state": "done"},
		}, h[1]["parts"], "the reasoning part comes before the text part")

		msgs := s.do(t, s.alice, "GET", convPath("thinking", "/messages"), nil)
		require.Equal(t, http.StatusOK, msgs.Status, msgs.Raw)
		list := msgs.Body["messages"].([]any)
		require.Len(t, list, 2)
		require.NotContains(t, list[0], "reasoning", "a message without reasoning has no field for it")
		require.Equal(t, "r1 r2 r3 r4 r5 r6", list[1].(map[string]any)["reasoning"])
		require.Equal(t, "t1 t2 t3 t4 t5 t6", list[1].(map[string]any)["content"])
	})

	t.Run("a resumed stream shows the reasoning and the text exactly once", func(t *testing.T) {
		t.Parallel()
		post := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("thought-resumed", "tr1", "think 40"))
		for post.count("reasoning-delta") < 10 {
			require.NotNil(t, post.next(), "the stream ended after %d reasoning deltas", post.count("reasoning-delta"))
		}
		resumed := s.openChat(t, s.other, "GET", "/v1/chat/thought-resumed/stream", s.alice, nil)
		resumed.rest()
		post.rest()
		for _, c := range []*chunks{post, resumed} {
			require.Equal(t, words("r", 40), c.reasoning(), "the reasoning so far, then live deltas: nothing twice, nothing skipped")
			require.Equal(t, words("t", 40), c.text())
			require.Equal(t, 1, c.count("reasoning-start"))
			require.Equal(t, 1, c.count("text-start"))
		}
		require.GreaterOrEqual(t, strings.Count(resumed.first("reasoning-delta")["delta"].(string), "r"), 10,
			"the first reasoning delta is the reasoning so far")
	})

	t.Run("a failed turn ends with an error chunk carrying the user's text", func(t *testing.T) {
		t.Parallel()
		c := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("failing", "f1", "fail please"))
		c.rest()
		e := c.first("error")
		require.Contains(t, e["errorText"], "not allowed to use its model")
		require.NotContains(t, e["errorText"], "api key", "the operator's cause stays out of sight")
		h := s.history(t, s.alice, "failing")
		require.Len(t, h, 2)
		require.Equal(t, map[string]any{"failed": true}, h[1]["metadata"])
	})

	t.Run("a tool call shows its input and output", func(t *testing.T) {
		t.Parallel()
		c := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("tools", "k1", "tool time"))
		c.rest()
		in := c.first("tool-input-available")
		require.Equal(t, "clock", in["toolName"])
		require.Equal(t, map[string]any{"time_zone": "UTC"}, in["input"])
		require.Equal(t, true, in["dynamic"])
		out := c.first("tool-output-available")
		require.Equal(t, in["toolCallId"], out["toolCallId"])
		require.Contains(t, out["output"], "T", "an RFC 3339 time")
		require.Equal(t, "It is now.", c.text())
		h := s.history(t, s.alice, "tools")
		parts := h[1]["parts"].([]any)
		require.Equal(t, "dynamic-tool", parts[1].(map[string]any)["type"])
		require.Equal(t, "output-available", parts[1].(map[string]any)["state"])
	})

	t.Run("another user's chat is not found, and the same id is another chat", func(t *testing.T) {
		t.Parallel()
		mine := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("private", "x1", "alice's secret"))
		mine.rest()
		for _, r := range []response{
			s.do(t, s.bob, "GET", "/v1/chat/private", nil),
			s.do(t, s.bob, "GET", "/v1/chat/private/stream", nil),
			s.do(t, s.bob, "POST", "/v1/conversations/private/stop", nil),
			s.do(t, s.bob, "POST", "/v1/chat", chatBody("private", "x1", "x", map[string]any{"trigger": "regenerate-message"})),
		} {
			require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
			require.NotContains(t, r.Raw, "secret")
		}
		theirs := s.openChat(t, s.srv, "POST", "/v1/chat", s.bob, chatBody("private", "x1", "bob's own"))
		theirs.rest()
		require.Equal(t, "echo: bob's own", theirs.text())
		h := s.history(t, s.alice, "private")
		require.Len(t, h, 2)
		require.Equal(t, "echo: alice's secret", textOf(h[1]), "alice's chat is as it was")
	})

}

// approvalAnswer is useChat's request after addToolApprovalResponse: the
// chat's messages, the last one the reply whose tool part the user
// answered, as the client shows it.
func approvalAnswer(chatID, userID, userText string, requested *chunks, approvalID string, approved bool) map[string]any {
	in := requested.first("tool-input-available")
	return map[string]any{
		"id":        chatID,
		"trigger":   "submit-message",
		"messageId": requested.first("start")["messageId"],
		"messages": []any{
			map[string]any{"id": userID, "role": "user", "parts": []any{map[string]any{"type": "text", "text": userText}}},
			map[string]any{"id": requested.first("start")["messageId"], "role": "assistant", "parts": []any{
				map[string]any{"type": "step-start"},
				map[string]any{"type": "text", "text": requested.text(), "state": "done"},
				map[string]any{"type": "dynamic-tool", "toolName": in["toolName"], "toolCallId": in["toolCallId"], "state": "approval-responded",
					"input": in["input"], "approval": map[string]any{"id": approvalID, "approved": approved}},
			}},
		},
	}
}

// keys are a chunk's fields.
func keys(ch map[string]any) []string {
	var out []string
	for k := range ch {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestAChatTurnThatWaitsForApprovalAsksInTheStreamAndTheNextRequestAnswers:
// the AI SDK's tool approval, over Baton's durable approvals. The stream
// shows the call and a tool-approval-request (fields both majors' strict
// clients accept, no others), and ends while the turn waits; a resume
// while it waits shows the same, the text before the call included;
// useChat's next request, whose last
// message is the reply with the tool part answered, decides the approval
// and streams the rest of the same reply (the call's outcome, then the
// text), without the parts the client has. Approved, the call is sent
// once; denied, never, and the stream says tool-output-denied. The
// history shows both. Another user cannot answer, an answer cannot
// change, and a stop while the turn waits denies the call.
func TestAChatTurnThatWaitsForApprovalAsksInTheStreamAndTheNextRequestAnswers(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)

	// waits posts "mail ..." to chat and reads the stream to its end: the
	// turn waits for approval. It returns the stream and the approval.
	waits := func(t *testing.T, chat, to string) (*chunks, string) {
		t.Helper()
		c := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody(chat, chat+"-m1", "mail "+to))
		c.rest()
		require.Equal(t, "Checking.", c.text(), "the text before the call streams as usual")
		in := c.first("tool-input-available")
		require.Equal(t, []string{"dynamic", "input", "toolCallId", "toolName", "type"}, keys(in))
		require.Equal(t, "mail__send", in["toolName"])
		require.Equal(t, map[string]any{"to": to}, in["input"])
		req := c.first("tool-approval-request")
		require.Equal(t, []string{"approvalId", "toolCallId", "type"}, keys(req), "only the fields of the SDK's chunk schema")
		require.Equal(t, in["toolCallId"], req["toolCallId"])
		approvalID := req["approvalId"].(string)
		require.True(t, strings.HasPrefix(approvalID, "ap_"), approvalID)
		types := c.types()
		require.Equal(t, []string{"tool-input-available", "tool-approval-request", "finish-step", "finish"}, types[len(types)-4:],
			"the stream asks, then ends while the turn waits: %v", types)
		require.Equal(t, "tool-calls", c.first("finish")["finishReason"])
		for _, call := range s.mail.Calls() {
			require.NotContains(t, call, `"`+to+`"`, "nothing is sent before the approval")
		}
		return c, approvalID
	}

	t.Run("approved: the call runs once and the same reply goes on", func(t *testing.T) {
		t.Parallel()
		first, approvalID := waits(t, "mail-yes", "bob")
		replyID := first.first("start")["messageId"]

		resumed := s.openChat(t, s.other, "GET", "/v1/chat/mail-yes/stream", s.alice, nil)
		resumed.rest()
		require.Equal(t, []string{"start", "start-step", "text-start", "text-delta", "text-end", "tool-input-available", "tool-approval-request", "finish-step", "finish"}, resumed.types(),
			"a reload while the turn waits shows the request again, after the text the turn said before it")
		require.Equal(t, "Checking.", resumed.text(), "the text before the call, from the journal: a reload saw none of its deltas")
		require.Equal(t, replyID, resumed.first("start")["messageId"])
		require.Equal(t, approvalID, resumed.first("tool-approval-request")["approvalId"])

		bob := s.do(t, s.bob, "POST", "/v1/chat", approvalAnswer("mail-yes", "mail-yes-m1", "mail bob", first, approvalID, true))
		require.Equal(t, http.StatusNotFound, bob.Status, "another user cannot answer: %s", bob.Raw)
		s.openChat(t, s.srv, "POST", "/v1/chat", s.bob, chatBody("bobs-mail", "bm1", "hello")).rest()
		bob = s.do(t, s.bob, "POST", "/v1/chat", approvalAnswer("bobs-mail", "bm1", "hello", first, approvalID, true))
		require.Equal(t, http.StatusNotFound, bob.Status, "not from a chat of their own either: %s", bob.Raw)

		answer := approvalAnswer("mail-yes", "mail-yes-m1", "mail bob", first, approvalID, true)
		rest := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, answer)
		rest.rest()
		require.Equal(t, replyID, rest.first("start")["messageId"], "the same reply goes on")
		require.Zero(t, rest.count("tool-input-available"), "the client has the call already: %v", rest.types())
		out := rest.first("tool-output-available")
		require.Equal(t, first.first("tool-input-available")["toolCallId"], out["toolCallId"])
		require.Equal(t, `sent {"to":"bob"}`, out["output"])
		require.Equal(t, "\n\nSent.", rest.text(), "only the text the client lacks")
		require.Equal(t, "stop", rest.first("finish")["finishReason"])
		require.Equal(t, []string{`{"to":"bob"}`}, s.mail.Calls(), "the approved call was sent once")

		again := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, answer)
		again.rest()
		require.Equal(t, replyID, again.first("start")["messageId"], "the same answer again follows the same reply")
		require.Len(t, s.mail.Calls(), 1, "and sends nothing again")
		change := s.do(t, s.alice, "POST", "/v1/chat", approvalAnswer("mail-yes", "mail-yes-m1", "mail bob", first, approvalID, false))
		require.Equal(t, http.StatusConflict, change.Status, "an answer cannot change: %s", change.Raw)
		require.Contains(t, change.Raw, "approval_decided")

		h := s.history(t, s.alice, "mail-yes")
		require.Len(t, h, 2)
		require.Equal(t, replyID, h[1]["id"])
		require.Equal(t, "Checking.\n\nSent.", textOf(h[1]))
		tool := h[1]["parts"].([]any)[1].(map[string]any)
		require.Equal(t, "output-available", tool["state"])
		require.Equal(t, `sent {"to":"bob"}`, tool["output"])
	})

	t.Run("denied: the call is never sent and the stream says so", func(t *testing.T) {
		t.Parallel()
		first, approvalID := waits(t, "mail-no", "carol")
		rest := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, approvalAnswer("mail-no", "mail-no-m1", "mail carol", first, approvalID, false))
		rest.rest()
		denied := rest.first("tool-output-denied")
		require.Equal(t, []string{"toolCallId", "type"}, keys(denied))
		require.Equal(t, first.first("tool-input-available")["toolCallId"], denied["toolCallId"])
		require.Zero(t, rest.count("tool-output-available"))
		require.Contains(t, rest.text(), "Not sent.")
		require.NotContains(t, rest.text(), "Checking.", "the client has that text already")
		for _, call := range s.mail.Calls() {
			require.NotContains(t, call, `"carol"`, "a denied call is never sent")
		}
		h := s.history(t, s.alice, "mail-no")
		tool := h[1]["parts"].([]any)[1].(map[string]any)
		require.Equal(t, "output-denied", tool["state"])
		require.Equal(t, map[string]any{"id": approvalID, "approved": false}, tool["approval"])
	})

	t.Run("a stop while the turn waits denies the call and ends the wait", func(t *testing.T) {
		t.Parallel()
		first, approvalID := waits(t, "mail-stop", "dave")
		r := s.do(t, s.alice, "POST", "/v1/conversations/mail-stop/stop", nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		require.Equal(t, map[string]any{"stopped": true, "settled": float64(1)}, r.Body)
		require.Equal(t, http.StatusNoContent, s.do(t, s.alice, "GET", "/v1/chat/mail-stop/stream", nil).Status, "nothing waits any more")
		late := s.do(t, s.alice, "POST", "/v1/chat", approvalAnswer("mail-stop", "mail-stop-m1", "mail dave", first, approvalID, true))
		require.Equal(t, http.StatusConflict, late.Status, "the stop decided it: %s", late.Raw)
		require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM approvals WHERE public_id = $1 AND status = 'denied'`, approvalID))
		next := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("mail-stop", "mail-stop-m2", "after the stop"))
		next.rest()
		require.Equal(t, "echo: after the stop", next.text(), "a message after the stop gets a turn of its own")
	})
}
