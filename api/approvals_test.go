package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// parkedApproval has alice post a message to cid, a worker's run claim it
// and stop at a write that needs approval, as a worker does: it returns
// the approval's id.
func (b *bundle) parkedApproval(t *testing.T, cid, args string, ttl time.Duration) string {
	t.Helper()
	ctx := context.Background()
	b.createConversation(t, b.alice, cid)
	r := b.do(t, b.alice, "POST", convPath(cid, "/messages"), map[string]any{"id": cid + "-m1", "content": "send the mail"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	conv, err := schema.GetConversation(ctx, b.pool, b.aliceID, cid)
	require.NoError(t, err)
	run := "run_approval_" + cid
	var req schema.Requested
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: conv.Key, RunID: run, Worker: "test", Lease: time.Minute, MaxAttempts: 3})
		if err != nil {
			return err
		}
		req, err = schema.RequestApprovalTx(ctx, tx, schema.ApprovalRequest{
			ConversationID: conv.Key, RunID: run, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs,
			Operation: schema.Operation{RunID: run, ConversationID: conv.Key, ToolCallID: "call_1", Tool: "mail__send",
				ToolVersion: "1", Effect: schema.EffectWrite, IdempotencyKey: "mcp_test", Arguments: args, DefinitionSHA256: "def"},
			State: []byte(`{}`), TTL: ttl,
		})
		return err
	})
	require.NoError(t, err)
	return req.ApprovalID
}

func TestAnApprovalIsShownToItsUserAndDecidedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.parkedApproval(t, "mail", `{"to": "bob@example.com"}`, time.Hour)

	conv := b.do(t, b.alice, "GET", convPath("mail"), nil)
	require.Equal(t, "waiting_for_approval", conv.Body["turn_state"], "the conversation says it waits for an approval")
	list := b.do(t, b.alice, "GET", convPath("mail", "/approvals"), nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	approvals := list.Body["approvals"].([]any)
	require.Len(t, approvals, 1)
	shown := approvals[0].(map[string]any)
	require.Equal(t, id, shown["id"])
	require.Equal(t, "mail__send", shown["tool"])
	require.Equal(t, "call_1", shown["tool_call_id"], "the model's id of the call, for clients that track tool parts")
	require.Equal(t, "pending", shown["status"])
	require.Equal(t, map[string]any{"to": "bob@example.com"}, shown["arguments"])

	bad := b.do(t, b.alice, "POST", convPath("mail", "/approvals/"+id), map[string]any{})
	require.Equal(t, http.StatusBadRequest, bad.Status, "a decision needs approved: %s", bad.Raw)
	wrong := b.do(t, b.alice, "POST", convPath("mail", "/approvals/"+id), map[string]any{"approved": true, "arguments_sha256": "00"})
	require.Equal(t, http.StatusConflict, wrong.Status, "a decision on other arguments than those stored is refused: %s", wrong.Raw)
	require.Equal(t, "arguments_changed", wrong.Body["error"].(map[string]any)["code"])

	ok := b.do(t, b.alice, "POST", convPath("mail", "/approvals/"+id), map[string]any{"approved": true, "arguments_sha256": shown["arguments_sha256"]})
	require.Equal(t, http.StatusOK, ok.Status, ok.Raw)
	require.Equal(t, "approved", ok.Body["status"])
	again := b.do(t, b.alice, "POST", convPath("mail", "/approvals/"+id), map[string]any{"approved": false})
	require.Equal(t, http.StatusConflict, again.Status, "an approval is decided once: %s", again.Raw)
	require.Equal(t, "approval_decided", again.Body["error"].(map[string]any)["code"])
	var status string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT status FROM approvals WHERE public_id = $1`, id).Scan(&status))
	require.Equal(t, "approved", status, "the second decision changed nothing")
}

func TestAnotherUserCannotSeeOrAnswerAnApproval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.parkedApproval(t, "private", `{"to": "x"}`, time.Hour)

	list := b.do(t, b.bob, "GET", convPath("private", "/approvals"), nil)
	require.Equal(t, http.StatusNotFound, list.Status, "another user's approvals are a 404 like a missing conversation: %s", list.Raw)
	post := b.do(t, b.bob, "POST", convPath("private", "/approvals/"+id), map[string]any{"approved": true})
	require.Equal(t, http.StatusNotFound, post.Status, "another user cannot answer: %s", post.Raw)
	// Bob's own conversation of the same id does not reach alice's approval.
	b.createConversation(t, b.bob, "private")
	post = b.do(t, b.bob, "POST", convPath("private", "/approvals/"+id), map[string]any{"approved": true})
	require.Equal(t, http.StatusNotFound, post.Status, "an approval belongs to its conversation: %s", post.Raw)
	missing := b.do(t, b.alice, "POST", convPath("private", "/approvals/ap_missing"), map[string]any{"approved": true})
	require.Equal(t, http.StatusNotFound, missing.Status, missing.Raw)
	var status string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT status FROM approvals WHERE public_id = $1`, id).Scan(&status))
	require.Equal(t, "pending", status, "nothing changed")
}

func TestChangedArgumentsCannotBeApproved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.parkedApproval(t, "tamper", `{"amount": 10}`, time.Hour)
	_, err := b.pool.Exec(context.Background(), `UPDATE operations SET arguments = '{"amount": 10000}' WHERE tool = 'mail__send'`)
	require.NoError(t, err)
	r := b.do(t, b.alice, "POST", convPath("tamper", "/approvals/"+id), map[string]any{"approved": true})
	require.Equal(t, http.StatusConflict, r.Status, "stored arguments that changed are not approved: %s", r.Raw)
	require.Equal(t, "arguments_changed", r.Body["error"].(map[string]any)["code"])
}

func TestAnApprovalPastItsTimeIsExpiredNotApproved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.parkedApproval(t, "late", `{}`, time.Second)
	_, err := b.pool.Exec(context.Background(), `UPDATE approvals SET expires_at = now() - interval '1 second' WHERE public_id = $1`, id)
	require.NoError(t, err)
	r := b.do(t, b.alice, "POST", convPath("late", "/approvals/"+id), map[string]any{"approved": true})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "approval_expired", r.Body["error"].(map[string]any)["code"])
	var status, op string
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT a.status, o.status FROM approvals a JOIN operations o ON o.id = a.operation_id WHERE a.public_id = $1`, id).Scan(&status, &op))
	require.Equal(t, "expired", status)
	require.Equal(t, "denied", op, "the call is denied, never sent")
}

// parkedQuestion has alice post a message to cid and a worker's run claim
// it and stop at a question its agent asks, as a worker does: it returns
// the approval's id.
func (b *bundle) parkedQuestion(t *testing.T, cid string, q schema.Question) string {
	t.Helper()
	ctx := context.Background()
	b.createConversation(t, b.alice, cid)
	r := b.do(t, b.alice, "POST", convPath(cid, "/messages"), map[string]any{"id": cid + "-m1", "content": "plan my trip"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	conv, err := schema.GetConversation(ctx, b.pool, b.aliceID, cid)
	require.NoError(t, err)
	run := "run_question_" + cid
	var req schema.Requested
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: conv.Key, RunID: run, Worker: "test", Lease: time.Minute, MaxAttempts: 3})
		if err != nil {
			return err
		}
		req, err = schema.RequestApprovalTx(ctx, tx, schema.ApprovalRequest{
			ConversationID: conv.Key, RunID: run, TurnID: c.TurnID, OutboxIDs: c.OutboxIDs, Question: &q, Step: 0,
			State: []byte(`{}`), TTL: time.Hour,
		})
		return err
	})
	require.NoError(t, err)
	return req.ApprovalID
}

// TestAnAgentsQuestionIsAnsweredWithWhatItsSchemaTakes: the question is
// shown to its user (not to another), an answer its schema refuses gets
// 422 and changes nothing, and the one it takes decides it once.
func TestAnAgentsQuestionIsAnsweredWithWhatItsSchemaTakes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.parkedQuestion(t, "trip", schema.Question{ID: "int_1", Reason: "input", Message: "Which city?",
		ResponseSchema: []byte(`{"type":"object","properties":{"city":{"type":"string","minLength":1}},"required":["city"],"additionalProperties":false}`),
		Data:           []byte(`{"task":"secret-internal"}`)})

	conv := b.do(t, b.alice, "GET", convPath("trip"), nil)
	require.Equal(t, "waiting_for_approval", conv.Body["turn_state"])
	list := b.do(t, b.alice, "GET", convPath("trip", "/approvals"), nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	shown := list.Body["approvals"].([]any)[0].(map[string]any)
	require.Equal(t, "question", shown["kind"])
	question := shown["question"].(map[string]any)
	require.Equal(t, "Which city?", question["message"])
	require.Equal(t, "int_1", question["id"])
	require.NotNil(t, question["response_schema"])
	require.NotContains(t, list.Raw, "secret-internal", "the protocol's own data about a question is never shown")

	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "POST", convPath("trip", "/approvals/"+id), map[string]any{"answer": map[string]any{"city": "Lima"}}).Status,
		"another user cannot answer")
	for _, bad := range []any{map[string]any{"city": ""}, map[string]any{"city": "Lima", "extra": 1}, "Lima"} {
		r := b.do(t, b.alice, "POST", convPath("trip", "/approvals/"+id), map[string]any{"answer": bad})
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, "an answer the schema refuses: %s", r.Raw)
		require.Equal(t, "answer_invalid", r.Body["error"].(map[string]any)["code"])
	}
	missing := b.do(t, b.alice, "POST", convPath("trip", "/approvals/"+id), map[string]any{"approved": true})
	require.Equal(t, http.StatusUnprocessableEntity, missing.Status, "a question with a schema expects an answer: %s", missing.Raw)
	require.Equal(t, 1, testenv.Count(t, b.pool, `SELECT count(*) FROM approvals WHERE public_id = $1 AND status = 'pending' AND answer IS NULL`, id),
		"a refused answer changes nothing")

	ok := b.do(t, b.alice, "POST", convPath("trip", "/approvals/"+id), map[string]any{"answer": map[string]any{"city": "Lima"}})
	require.Equal(t, http.StatusOK, ok.Status, ok.Raw)
	require.Equal(t, "approved", ok.Body["status"])
	require.Equal(t, map[string]any{"city": "Lima"}, ok.Body["answer"])
	again := b.do(t, b.alice, "POST", convPath("trip", "/approvals/"+id), map[string]any{"answer": map[string]any{"city": "Quito"}})
	require.Equal(t, http.StatusConflict, again.Status, again.Raw)
}
