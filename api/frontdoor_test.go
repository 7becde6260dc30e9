package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// setupLogged is setup with the server's log kept, and chat bodies
// limited to 64 KiB.
func setupLogged(t testing.TB) (*bundle, *lockedBuffer) {
	t.Helper()
	var logs lockedBuffer
	log := zerolog.New(&logs)
	b := setupEdge(t, api.Config{MaxContentBytes: 1024, MaxChatBodyBytes: 64 << 10, MessagesPerMinute: 100000, MessageBurst: 10000, Logger: &log}, nil)
	return b, &logs
}

// refused sends a raw body and requires the answer to be status with
// code, with nothing written and nothing logged as a failure.
func (b *bundle) refused(t *testing.T, logs *lockedBuffer, method, path, body string, status int, code string) {
	t.Helper()
	before := counts(t, b.pool)
	r := b.do(t, b.alice, method, path, body)
	require.Equal(t, status, r.Status, "%s %s %q: %s", method, path, body, r.Raw)
	require.Equal(t, code, r.Body["error"].(map[string]any)["code"], "%s %s %q: %s", method, path, body, r.Raw)
	require.Equal(t, before, counts(t, b.pool), "%s %s %q wrote nothing", method, path, body)
	require.NotContains(t, logs.String(), `"level":"error"`, "a refused request is no server error")
}

// chatRaw is useChat's body for a new message, with the chat id, the
// message id and the text as raw JSON string contents (escapes kept).
func chatRaw(chatID, messageID, text string) string {
	return `{"id":"` + chatID + `","trigger":"submit-message","messages":[{"id":"` + messageID +
		`","role":"user","parts":[{"type":"text","text":"` + text + `"}]}]}`
}

// approvalRaw is useChat's body answering an approval whose id is the
// raw JSON string contents approvalID.
func approvalRaw(chatID, approvalID string) string {
	return `{"id":"` + chatID + `","trigger":"submit-message","messages":[{"id":"reply","role":"assistant","parts":[` +
		`{"type":"dynamic-tool","toolName":"mail__send","toolCallId":"call_1","state":"approval-responded","input":{},` +
		`"approval":{"id":"` + approvalID + `","approved":true}}]}]}`
}

// TestANULCharacterIsRefusedWith400WhereverItWouldBeStored: U+0000 is
// valid JSON but no PostgreSQL text holds it. In a message's content, a
// conversation's title, a chat message's text, an approval's id (in the
// path or in useChat's tool part) and an answer to a question, it is
// refused with 400 and a code that says what is wrong, nothing is
// written and nothing is logged as a server error (it was a 500).
func TestANULCharacterIsRefusedWith400WhereverItWouldBeStored(t *testing.T) {
	t.Parallel()
	b, logs := setupLogged(t)
	b.createConversation(t, b.alice, "c1")

	b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"m1","content":"a\u0000b"}`, http.StatusBadRequest, "bad_text")
	b.refused(t, logs, "POST", "/v1/conversations", `{"id":"c2","title":"a\u0000b"}`, http.StatusBadRequest, "bad_text")
	b.refused(t, logs, "POST", "/v1/conversations", `{"id":"c\u00002"}`, http.StatusBadRequest, "bad_id")
	b.refused(t, logs, "POST", "/v1/chat", chatRaw("chat1", "m1", `a\u0000b`), http.StatusBadRequest, "bad_text")
	b.refused(t, logs, "POST", "/v1/chat", chatRaw("c1", "m1", `a\u0000b`), http.StatusBadRequest, "bad_text")
	b.refused(t, logs, "POST", "/v1/chat", approvalRaw("c1", `ap_\u0000`), http.StatusBadRequest, "bad_id")
	b.refused(t, logs, "POST", convPath("c1", "/approvals/ap_%00x"), `{"approved":true}`, http.StatusBadRequest, "bad_id")
	b.refused(t, logs, "POST", convPath("c1", "/approvals/ap_x"), `{"answer":{"a\u0000":"b"}}`, http.StatusBadRequest, "bad_text")
	b.refused(t, logs, "POST", convPath("c1", "/approvals/ap_x"), `{"answer":"\u0000"}`, http.StatusBadRequest, "bad_text")

	// The Go producer refuses it too, as invalid text.
	_, err := schema.InsertMessageTx(context.Background(), b.pool, schema.UserMessage{
		OwnerID: b.aliceID, ConversationID: "c1", MessageID: "m1", Content: "a\x00b"})
	require.ErrorIs(t, err, schema.ErrBadText)
	require.ErrorIs(t, err, schema.ErrInvalid)
	_, _, err = schema.CreateConversation(context.Background(), b.pool, b.aliceID, "c3", "a\x00b")
	require.ErrorIs(t, err, schema.ErrBadText)
}

// TestInvalidUTF8AndUnpairedSurrogatesAreRefusedNotStoredAsReplacementCharacters:
// Go's JSON decoder turns bytes that are not UTF-8 and an unpaired
// surrogate escape into U+FFFD, so that "a\ud800" and "a\udfff" were one
// stored id. In ids, content and titles, of the REST routes and the chat
// route alike, they are refused with 400 bad_text and nothing is written;
// a surrogate pair (an emoji) is stored as the character it is.
func TestInvalidUTF8AndUnpairedSurrogatesAreRefusedNotStoredAsReplacementCharacters(t *testing.T) {
	t.Parallel()
	b, logs := setupLogged(t)
	b.createConversation(t, b.alice, "c1")

	// The last one is a high surrogate right before the string's end.
	for _, bad := range []string{"\xff", "a\xc3", "\xed\xa0\x80", `\ud800`, `a\udfffb`, `\ud800\u0041`, `\ud800\ud800`, `\ud83d`} {
		b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"m`+bad+`","content":"hi"}`, http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"m1","content":"`+bad+`"}`, http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", "/v1/conversations", `{"id":"c`+bad+`"}`, http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", "/v1/conversations", `{"id":"c2","title":"`+bad+`"}`, http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", "/v1/chat", chatRaw("chat"+bad, "m1", "hi"), http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", "/v1/chat", chatRaw("c1", "m"+bad, "hi"), http.StatusBadRequest, "bad_text")
		b.refused(t, logs, "POST", "/v1/chat", chatRaw("c1", "m1", bad), http.StatusBadRequest, "bad_text")
	}

	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), `{"id":"m\ud83d\ude00","content":"\ud83d\ude00"}`)
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	require.Equal(t, "m😀", r.Body["id"])
	require.Equal(t, "😀", r.Body["content"])
}

// TestABodyOverItsLimitGets413BodyTooLargeEverywhere: a part of a chat's
// body far over --max-chat-body-bytes, wherever it is (a message's text,
// the history, the chat's id, a field Baton skips), is 413
// body_too_large as documented, never 400 "malformed JSON"; so is a REST
// body over its limit.
func TestABodyOverItsLimitGets413BodyTooLargeEverywhere(t *testing.T) {
	t.Parallel()
	b, logs := setupLogged(t)
	b.createConversation(t, b.alice, "c1")
	big := strings.Repeat("x", 200<<10)

	b.refused(t, logs, "POST", "/v1/chat", chatRaw("c1", "m1", big), http.StatusRequestEntityTooLarge, "body_too_large")
	b.refused(t, logs, "POST", "/v1/chat", chatRaw(big, "m1", "hi"), http.StatusRequestEntityTooLarge, "body_too_large")
	b.refused(t, logs, "POST", "/v1/chat", `{"id":"c1","trigger":"submit-message","extra":"`+big+`"}`, http.StatusRequestEntityTooLarge, "body_too_large")
	b.refused(t, logs, "POST", "/v1/chat", `{"id":"c1","messages":[{"id":"h","role":"user","parts":[{"type":"text","text":"`+big+`"}]},`,
		http.StatusRequestEntityTooLarge, "body_too_large")
	b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"m1","content":"`+strings.Repeat("x", 11<<10)+`"}`,
		http.StatusRequestEntityTooLarge, "body_too_large")
	b.refused(t, logs, "POST", "/v1/conversations", `{"id":"c2","title":"`+big+`"}`, http.StatusRequestEntityTooLarge, "body_too_large")
}

// TestIdsThatCannotRoundTripThroughAURLPathAreRefusedByEveryWritePath:
// "." and ".." were taken as chat and conversation ids, but URLs drop
// such a path segment, so that GET could never reach what POST made.
// The API, the Go producer and the SQL producer refuse them; "..." and
// ids with slashes, which do round-trip, stay valid.
func TestIdsThatCannotRoundTripThroughAURLPathAreRefusedByEveryWritePath(t *testing.T) {
	t.Parallel()
	b, logs := setupLogged(t)
	ctx := context.Background()
	b.createConversation(t, b.alice, "c1")
	for _, id := range []string{".", ".."} {
		b.refused(t, logs, "POST", "/v1/conversations", `{"id":"`+id+`"}`, http.StatusBadRequest, "bad_id")
		b.refused(t, logs, "POST", "/v1/chat", chatRaw(id, "m1", "hi"), http.StatusBadRequest, "bad_id")
		b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"`+id+`","content":"hi"}`, http.StatusBadRequest, "bad_id")

		_, _, err := schema.CreateConversation(ctx, b.pool, b.aliceID, id, "")
		require.ErrorIs(t, err, schema.ErrInvalid, "the Go producer refuses %q", id)
		_, err = b.pool.Exec(ctx, `SELECT * FROM baton_create_conversation('alice', $1)`, id)
		requireSQLState(t, err, schema.SQLStateBadConversationID)
		_, err = b.pool.Exec(ctx, `SELECT * FROM baton_send_message('alice', 'c1', $1, 'hi')`, id)
		requireSQLState(t, err, schema.SQLStateBadMessageID)
	}
	for _, id := range []string{"...", "a/b", "a/../b", "?#%"} {
		b.createConversation(t, b.alice, id)
		r := b.do(t, b.alice, "GET", convPath(id), nil)
		require.Equal(t, http.StatusOK, r.Status, "%q round-trips: %s", id, r.Raw)
		require.Equal(t, id, r.Body["id"])
	}
}

// TestAUserMessageCannotTakeAnIdOfTheServersReplies: replies and visible
// errors have ids of the server's ("reply_…", "error_…"); a user message
// that took one made two messages of a conversation show one id. Every
// write path refuses such an id: 400 reserved_id from the API (REST and
// chat), PB013 from the SQL producer, ErrReservedID from the Go one.
func TestAUserMessageCannotTakeAnIdOfTheServersReplies(t *testing.T) {
	t.Parallel()
	b, logs := setupLogged(t)
	ctx := context.Background()
	b.createConversation(t, b.alice, "c1")
	reply := schema.ReplyID([]int64{1}, 0)
	for _, id := range []string{reply, "error_1", "reply_"} {
		b.refused(t, logs, "POST", convPath("c1", "/messages"), `{"id":"`+id+`","content":"hi"}`, http.StatusBadRequest, "reserved_id")
		b.refused(t, logs, "POST", "/v1/chat", chatRaw("c1", id, "hi"), http.StatusBadRequest, "reserved_id")
		_, err := schema.InsertMessageTx(ctx, b.pool, schema.UserMessage{OwnerID: b.aliceID, ConversationID: "c1", MessageID: id, Content: "hi"})
		require.ErrorIs(t, err, schema.ErrReservedID)
		_, err = b.pool.Exec(ctx, `SELECT * FROM baton_send_message('alice', 'c1', $1, 'hi')`, id)
		requireSQLState(t, err, schema.SQLStateReservedMessageID)
	}
	// A conversation may have such an id: no reply shares its list.
	b.createConversation(t, b.alice, "reply_c")
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "my_reply_1", "content": "hi"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
}

func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", code, err)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
}

// TestAMessageSentWhileATurnWaitsForApprovalShowsTheApprovalAtOnce: a
// message sent to a chat whose turn waits for its user's approval got a
// 200 stream that sent nothing until the approval was decided or expired
// (a day). Its stream now says at once why it waits: the pending
// approval's request, as a reload shows it, and its end for now.
func TestAMessageSentWhileATurnWaitsForApprovalShowsTheApprovalAtOnce(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)
	first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("waits", "waits-m1", "mail erin"))
	first.rest()
	approvalID := first.first("tool-approval-request")["approvalId"]

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	body, err := json.Marshal(chatBody("waits", "waits-m2", "are you there?"))
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, "POST", s.srv.URL+"/v1/chat", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.alice)
	resp, err := s.srv.Client().Do(req)
	require.NoError(t, err)
	next := streamOf(t, "POST", "/v1/chat", resp)
	next.rest()
	types := next.types()
	require.Equal(t, []string{"tool-approval-request", "finish-step", "finish"}, types[len(types)-3:],
		"the stream shows the approval the chat waits for, at once: %v", types)
	require.Equal(t, approvalID, next.first("tool-approval-request")["approvalId"])
	require.Equal(t, first.first("start")["messageId"], next.first("start")["messageId"], "the waiting turn's reply, as a reload shows it")
	require.Equal(t, "tool-calls", next.first("finish")["finishReason"])
}

// TestAnsweringAgainATurnThatMadeWritesIsRefusedUnlessTheRequestSaysToRepeatThem:
// a regenerate (useChat's regenerate(), which puts regenerate({body})'s
// fields in the request) or a retry (REST) of a turn that made a write
// ran the write again without a word. It is refused with 409
// turn_made_writes naming the write, and nothing changes; with
// "repeat_writes": true it goes ahead.
func TestAnsweringAgainATurnThatMadeWritesIsRefusedUnlessTheRequestSaysToRepeatThem(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)
	first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("writes", "writes-m1", "mail frank"))
	first.rest()
	approvalID := first.first("tool-approval-request")["approvalId"].(string)
	s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, approvalAnswer("writes", "writes-m1", "mail frank", first, approvalID, true)).rest()
	require.Len(t, s.mail.Calls(), 1, "the write was made")
	replyID := first.first("start")["messageId"]

	regenerate := chatBody("writes", "writes-m1", "mail frank", map[string]any{"trigger": "regenerate-message", "messageId": replyID})
	before := counts(t, s.pool)
	r := s.do(t, s.alice, "POST", "/v1/chat", regenerate)
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "turn_made_writes", r.Body["error"].(map[string]any)["code"])
	require.Contains(t, r.Raw, "mail__send", "the refusal names the write")
	require.Contains(t, r.Raw, "repeat_writes", "and says how to go ahead")
	require.Equal(t, before, counts(t, s.pool))
	require.Equal(t, 0, testenv.Count(t, s.pool, `SELECT count(*) FROM messages WHERE superseded_at IS NOT NULL`), "the reply is not replaced")

	regenerate["repeat_writes"] = true
	again := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, regenerate)
	again.rest()
	require.NotEqual(t, replyID, again.first("start")["messageId"], "a new turn answers, with a reply of its own")
	require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM messages WHERE superseded_at IS NOT NULL`))

	// The same through a REST retry: a turn that made a write, then
	// failed.
	second := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("writes-2", "writes-2-m1", "mail gina"))
	second.rest()
	approvalID = second.first("tool-approval-request")["approvalId"].(string)
	s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, approvalAnswer("writes-2", "writes-2-m1", "mail gina", second, approvalID, true)).rest()
	_, err := s.pool.Exec(context.Background(), `UPDATE agent_outbox SET status = 'error'
		WHERE conversation_id = (SELECT id FROM conversations WHERE public_id = 'writes-2')`)
	require.NoError(t, err)
	r = s.do(t, s.alice, "POST", convPath("writes-2", "/retry"), nil)
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "turn_made_writes", r.Body["error"].(map[string]any)["code"])
	require.Contains(t, r.Raw, "mail__send")
	require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id
		WHERE c.public_id = 'writes-2' AND o.status = 'error'`), "nothing was retried")
	r = s.do(t, s.alice, "POST", convPath("writes-2", "/retry"), map[string]any{"repeat_writes": true})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, float64(1), r.Body["retried"])
}

// TestAnExpiredApprovalAnsweredThroughUseChatGets409LikeThroughREST: an
// answer, in useChat's request, to an approval past its time was taken
// as given and streamed the turn on; it is 409 approval_expired, as the
// REST route answers, and the expiry (the call denied) is committed.
func TestAnExpiredApprovalAnsweredThroughUseChatGets409LikeThroughREST(t *testing.T) {
	t.Parallel()
	s := startChatStack(t)
	first := s.openChat(t, s.srv, "POST", "/v1/chat", s.alice, chatBody("late", "late-m1", "mail hank"))
	first.rest()
	approvalID := first.first("tool-approval-request")["approvalId"].(string)
	_, err := s.pool.Exec(context.Background(), `UPDATE approvals SET expires_at = now() - interval '1 second' WHERE public_id = $1`, approvalID)
	require.NoError(t, err)

	answer := approvalAnswer("late", "late-m1", "mail hank", first, approvalID, true)
	r := s.do(t, s.alice, "POST", "/v1/chat", answer)
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "approval_expired", r.Body["error"].(map[string]any)["code"])
	require.Equal(t, 1, testenv.Count(t, s.pool, `SELECT count(*) FROM approvals WHERE public_id = $1 AND status = 'expired'`, approvalID),
		"the expiry is committed")
	r = s.do(t, s.alice, "POST", "/v1/chat", answer)
	require.Equal(t, http.StatusConflict, r.Status, "the same answer again: %s", r.Raw)
	require.Equal(t, "approval_expired", r.Body["error"].(map[string]any)["code"])
	for _, call := range s.mail.Calls() {
		require.NotContains(t, call, "hank", "an expired call is never sent")
	}
}

// TestNoCursorOrEventAClientSeesCountsTheServersMessages: the message
// lists paged with the global seq (next_after, next_before, each
// message's "seq") and events carried the global outbox ids, so that any
// user could count the messages of the whole server. The cursors are
// opaque and the conversation's own: they page as before, say nothing
// that parses as a number, and one conversation's is refused in another
// (400 bad_cursor); messages carry no seq and a client's events no outbox
// ids.
func TestNoCursorOrEventAClientSeesCountsTheServersMessages(t *testing.T) {
	t.Parallel()
	l := startLiveAPI(t, nil, "alice")
	b, tok := l.bundle, l.alice
	b.createConversation(t, tok, "c1")
	b.createConversation(t, tok, "c2")
	s := openSSE(t, l.srv.URL+convPath("c1", "/events"), tok, "")
	for i, id := range []string{"m1", "m2", "m3"} {
		r := b.do(t, tok, "POST", convPath("c1", "/messages"), map[string]any{"id": id, "content": "hi"})
		require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
		require.NotContains(t, r.Body, "seq", "a stored message carries no global seq")
		if i == 0 {
			ev, _ := nextEvent(t, s)
			require.NotContains(t, ev.Data, "outbox_ids", "a client's event carries no outbox ids: %s", ev.Data)
		}
	}

	var ids []string
	after := ""
	for page := 0; ; page++ {
		require.Less(t, page, 5)
		path := convPath("c1", "/messages?limit=1")
		if after != "" {
			path += "&after=" + after
		}
		r := b.do(t, tok, "GET", path, nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		for _, m := range r.Body["messages"].([]any) {
			require.NotContains(t, m.(map[string]any), "seq")
			ids = append(ids, m.(map[string]any)["id"].(string))
		}
		next, ok := r.Body["next_after"].(string)
		if !ok {
			require.NotContains(t, r.Body, "next_after")
			break
		}
		_, err := strconv.ParseInt(next, 10, 64)
		require.Error(t, err, "the cursor %q is no number", next)
		after = next
		r = b.do(t, tok, "GET", convPath("c2", "/messages?after="+next), nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "another conversation's cursor: %s", r.Raw)
		require.Equal(t, "bad_cursor", r.Body["error"].(map[string]any)["code"])
	}
	require.Equal(t, []string{"m1", "m2", "m3"}, ids, "the cursors page through every message once")
	for _, bad := range []string{"0", "5", "-1", "AAAAAAAAAAAAAAAAAAAAAA", "%00"} {
		r := b.do(t, tok, "GET", convPath("c1", "/messages?after="+bad), nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "after=%s: %s", bad, r.Raw)
	}

	r := b.do(t, tok, "GET", "/v1/chat/c1?limit=2", nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	before, ok := r.Body["next_before"].(string)
	require.True(t, ok, "an older page follows: %s", r.Raw)
	_, err := strconv.ParseInt(before, 10, 64)
	require.Error(t, err, "the cursor %q is no number", before)
	r = b.do(t, tok, "GET", "/v1/chat/c1?before="+before, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Len(t, r.Body["messages"].([]any), 1)
	r = b.do(t, tok, "GET", "/v1/chat/c2?before="+before, nil)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
}
