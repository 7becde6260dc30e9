package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// TestDoubleTextingIsChosenAtCreationChangedByPatchAndShown: a
// conversation gets the server's policy unless the request names one; its
// owner changes it with PATCH, which refuses what is no policy and
// answers 404 to anyone else; GET shows it.
func TestDoubleTextingIsChosenAtCreationChangedByPatchAndShown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "plain"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, "debounce", r.Body["double_texting"], "the server's default")

	r = b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "queue", "double_texting": "enqueue"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, "enqueue", r.Body["double_texting"])

	before := counts(t, b.pool)
	r = b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "bad", "double_texting": "shout"})
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Equal(t, "bad_double_texting", errorCode(r))
	require.Contains(t, r.Raw, "enqueue, reject, interrupt or debounce", "the answer names the policies")
	require.Equal(t, before, counts(t, b.pool), "nothing is created")

	r = b.do(t, b.alice, "PATCH", convPath("plain"), map[string]any{"double_texting": "interrupt"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, "interrupt", r.Body["double_texting"])
	require.Equal(t, "plain", r.Body["id"])
	r = b.do(t, b.alice, "GET", convPath("plain"), nil)
	require.Equal(t, "interrupt", r.Body["double_texting"], "GET shows the new policy")

	for _, bad := range []struct{ body, code, says string }{
		{`{"double_texting": "later"}`, "bad_double_texting", "enqueue, reject, interrupt or debounce"},
		{`{"double_texting": null}`, "bad_body", "double_texting"},
		{`{}`, "bad_body", "double_texting"},
		{`{"title": "new"}`, "bad_json", "title"},
		{``, "bad_json", "empty"},
	} {
		r = b.do(t, b.alice, "PATCH", convPath("plain"), bad.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", bad.body, r.Raw)
		require.Equal(t, bad.code, errorCode(r), bad.body)
		require.Contains(t, r.Raw, bad.says, bad.body)
	}

	r = b.do(t, b.bob, "PATCH", convPath("plain"), map[string]any{"double_texting": "reject"})
	require.Equal(t, http.StatusNotFound, r.Status, "another user's conversation is not found: %s", r.Raw)
	r = b.do(t, b.alice, "GET", convPath("plain"), nil)
	require.Equal(t, "interrupt", r.Body["double_texting"], "another user's PATCH changed nothing")
	r = b.do(t, b.alice, "PATCH", convPath("none"), map[string]any{"double_texting": "reject"})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)

	// The server's own default comes from its configuration.
	srv, err := api.New(api.Config{DoubleTexting: schema.DoubleTextingEnqueue}, b.pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	other := &bundle{pool: b.pool, srv: hs, client: hs.Client()}
	r = other.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "configured"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, "enqueue", r.Body["double_texting"], "--double-texting chooses the default")
	_, err = api.New(api.Config{DoubleTexting: "shout"}, b.pool, nil)
	require.ErrorContains(t, err, "enqueue, reject, interrupt or debounce")
}

// TestAMessageWhileATurnRunsUnderRejectGets409AndWritesNothing: the
// conversation's first message waits for its turn; a second one is
// refused with turn_running and a message that says what to do, and
// neither a message nor an outbox row is written; the first one sent
// again is still a retry.
func TestAMessageWhileATurnRunsUnderRejectGets409AndWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "c", "double_texting": "reject"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	r = b.do(t, b.alice, "POST", convPath("c", "/messages"), map[string]any{"id": "m1", "content": "one"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)

	before := counts(t, b.pool)
	r = b.do(t, b.alice, "POST", convPath("c", "/messages"), map[string]any{"id": "m2", "content": "two"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "turn_running", errorCode(r))
	require.Contains(t, r.Raw, "double texting is reject: send the message once its reply is in, or stop the turn first")
	require.Equal(t, before, counts(t, b.pool), "a refused message writes no message and no outbox row")

	r = b.do(t, b.alice, "POST", convPath("c", "/messages"), map[string]any{"id": "m1", "content": "one"})
	require.Equal(t, http.StatusOK, r.Status, "a retry of the stored message is answered as always: %s", r.Raw)

	// Once its turn ended, the next message is stored.
	_, err := b.pool.Exec(context.Background(), `UPDATE agent_outbox SET status = 'done'`)
	require.NoError(t, err)
	r = b.do(t, b.alice, "POST", convPath("c", "/messages"), map[string]any{"id": "m2", "content": "two"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
}

// TestAChatIsCreatedWithTheServersDoubleTexting: POST /v1/chat makes its
// chat with the server's policy; under reject, a second message while the
// first waits for its turn gets 409 turn_running before any stream.
func TestAChatIsCreatedWithTheServersDoubleTexting(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(context.Background(), js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	token, _, err := schema.CreateToken(context.Background(), db.Pool, "alice")
	require.NoError(t, err)
	srv, err := api.New(api.Config{DoubleTexting: schema.DoubleTextingReject}, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	b := &bundle{pool: db.Pool, srv: hs, client: hs.Client()}

	chat := func(messageID, text string) *http.Response {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		body := `{"id": "chat", "messages": [{"id": "` + messageID + `", "role": "user", "parts": [{"type": "text", "text": "` + text + `"}]}]}`
		req, err := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/chat", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hs.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	// No worker runs: the first message's stream waits; its headers say
	// it was stored.
	resp := chat("m1", "one")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := b.do(t, token, "GET", convPath("chat"), nil)
	require.Equal(t, "reject", r.Body["double_texting"], "the chat has the server's policy")

	before := counts(t, db.Pool)
	resp = chat("m2", "two")
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"code":"turn_running"`)
	require.Equal(t, before, counts(t, db.Pool), "nothing is written")
}

func errorCode(r response) string {
	e, _ := r.Body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// TestInAChatThatInterruptsANewMessageStopsTheReplyAndOneReplyAnswersBoth
// is what a useChat user sees: the first request's stream ends with the
// reply so far, marked stopped, as a Stop ends it; the second request's
// stream is the reply of one turn, which answers both messages;
// the history shows the two messages and that reply.
func TestInAChatThatInterruptsANewMessageStopsTheReplyAndOneReplyAnswersBoth(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)
	r := s.do(t, s.alice, "POST", "/v1/conversations", map[string]any{"id": "cut", "double_texting": "interrupt"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("cut", "c1", "slow 500"))
	first.untilDeltas(3)
	second := s.openChat(t, s.other, "POST", "/v1/chat", s.alice, chatBody("cut", "c2", "and then?"))

	first.rest()
	require.Equal(t, map[string]any{"stopped": true}, first.first("finish")["messageMetadata"], "the first stream ends as a Stop ends it")
	require.NotEmpty(t, first.text())
	require.NotContains(t, first.text(), "w500", "stopped mid-reply")
	second.rest()
	require.Equal(t, "echo: and then?", second.text())
	require.NotEqual(t, first.first("start")["messageId"], second.first("start")["messageId"], "the new reply has an id of its own")

	require.Equal(t, 2, testenv.Count(t, s.pool, `
		SELECT cardinality(r.outbox_ids) FROM agent_runs r JOIN messages m ON m.id = r.reply_message_id
		WHERE m.content = 'echo: and then?'`), "one turn answered both messages")

	h := s.history(t, s.alice, "cut")
	var texts []string
	for _, m := range h {
		texts = append(texts, m["role"].(string)+": "+textOf(m))
	}
	require.Equal(t, []string{"user: slow 500", "user: and then?", "assistant: echo: and then?"}, texts,
		"the history shows the reply that answered both in place of the stopped one")
}
