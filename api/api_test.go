package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

type bundle struct {
	pool    *pgxpool.Pool
	srv     *httptest.Server
	alice   string // token
	bob     string // token
	aliceID int64
	natsURL string
	client  *http.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := testenv.Database(t)
	ctx := context.Background()
	a, alice, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	b, _, err := schema.CreateToken(ctx, db.Pool, "bob")
	require.NoError(t, err)
	s, err := api.New(api.Config{MaxContentBytes: 1024}, db.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return &bundle{pool: db.Pool, srv: hs, alice: a, bob: b, aliceID: alice.ID, client: hs.Client()}
}

type response struct {
	Status int
	Body   map[string]any
	Raw    string
}

func (b *bundle) do(t testing.TB, token, method, path string, body any) response {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	default:
		buf, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, b.srv.URL+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{Status: resp.StatusCode, Raw: string(raw)}
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &r.Body)
	}
	return r
}

func convPath(cid string, rest ...string) string {
	return "/v1/conversations/" + url.PathEscape(cid) + strings.Join(rest, "")
}

// counts returns the number of conversations, messages and outbox rows.
func counts(t testing.TB, pool *pgxpool.Pool) [3]int {
	t.Helper()
	var c [3]int
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM conversations), (SELECT count(*) FROM messages), (SELECT count(*) FROM agent_outbox)`).Scan(&c[0], &c[1], &c[2])
	require.NoError(t, err)
	return c
}

func (b *bundle) createConversation(t testing.TB, token, id string) {
	t.Helper()
	r := b.do(t, token, "POST", "/v1/conversations", map[string]any{"id": id, "title": "t"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
}

func TestPostMessageStoresMessageAndOutboxRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")

	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "hello"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	require.Equal(t, "m1", r.Body["id"])
	require.Equal(t, "user", r.Body["role"])
	require.Equal(t, "pending", r.Body["status"])

	var outboxStatus string
	var attempts int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT o.status, o.attempts FROM agent_outbox o JOIN messages m ON m.id = o.message_id JOIN conversations c ON c.id = o.conversation_id
		 WHERE m.public_id = 'm1' AND c.public_id = 'c1'`).Scan(&outboxStatus, &attempts))
	require.Equal(t, "pending", outboxStatus)
	require.Equal(t, 0, attempts)

	conv := b.do(t, b.alice, "GET", convPath("c1"), nil)
	require.Equal(t, http.StatusOK, conv.Status)
	require.Equal(t, "pending", conv.Body["turn_state"])
	require.NotNil(t, conv.Body["last_message_at"], "the producer touches the conversation's ordering metadata")

	list := b.do(t, b.alice, "GET", convPath("c1", "/messages"), nil)
	require.Equal(t, http.StatusOK, list.Status)
	msgs := list.Body["messages"].([]any)
	require.Len(t, msgs, 1)
	m := msgs[0].(map[string]any)
	require.Equal(t, "hello", m["content"])
	require.Equal(t, "pending", m["status"])
	require.NotEmpty(t, m["created_at"])
}

func TestRetriedPostCreatesOneMessageAndOneOutboxRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")

	const retries = 20
	statuses := make(chan int, retries)
	var wg sync.WaitGroup
	for range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses <- b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "same", "content": "hi"}).Status
		}()
	}
	wg.Wait()
	close(statuses)
	byStatus := map[int]int{}
	for s := range statuses {
		byStatus[s]++
	}
	require.Equal(t, map[int]int{http.StatusAccepted: 1, http.StatusOK: retries - 1}, byStatus,
		"exactly one request stores the message; the others see it already stored")
	require.Equal(t, [3]int{1, 1, 1}, counts(t, b.pool), "one conversation, one message, one outbox row")
}

func TestSameMessageIDWithOtherContentIsConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	b.createConversation(t, b.alice, "c2")
	require.Equal(t, http.StatusAccepted, b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m", "content": "a"}).Status)
	before := counts(t, b.pool)

	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m", "content": "b"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "conflict", r.Body["error"].(map[string]any)["code"])

	r = b.do(t, b.alice, "POST", convPath("c2", "/messages"), map[string]any{"id": "m", "content": "a"})
	require.Equal(t, http.StatusConflict, r.Status, "the same message ID in another conversation is a conflict: %s", r.Raw)
	require.Equal(t, before, counts(t, b.pool))
}

func TestFailedOutboxInsertLeavesNoMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	ctx := context.Background()
	// Make the outbox insert fail inside the producer's transaction.
	_, err := b.pool.Exec(ctx, `
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'outbox refused'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON agent_outbox FOR EACH ROW EXECUTE FUNCTION refuse();`)
	require.NoError(t, err)

	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "hello"})
	require.Equal(t, http.StatusInternalServerError, r.Status, r.Raw)
	require.Equal(t, [3]int{1, 0, 0}, counts(t, b.pool), "the message must not be stored without its outbox row")

	// The library form: the caller's transaction, rolled back by the caller.
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: b.aliceID, ConversationID: "c1", MessageID: "m2", Content: "x"})
		return err
	})
	require.ErrorContains(t, err, "outbox refused")
	require.Equal(t, [3]int{1, 0, 0}, counts(t, b.pool))
}

func TestInsertMessageTxReportsExisting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	ctx := context.Background()
	msg := schema.UserMessage{OwnerID: b.aliceID, ConversationID: "c1", MessageID: "m1", Content: "hi"}
	var first, second schema.InsertResult
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		first, err = schema.InsertMessageTx(ctx, tx, msg)
		return err
	}))
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		second, err = schema.InsertMessageTx(ctx, tx, msg)
		return err
	}))
	require.False(t, first.Existed)
	require.True(t, second.Existed, "the second call reports that the message already existed")
	require.Equal(t, first.OutboxID, second.OutboxID)
	require.Equal(t, [3]int{1, 1, 1}, counts(t, b.pool))

	_, err := schema.InsertMessageTx(ctx, b.pool, schema.UserMessage{OwnerID: b.aliceID, ConversationID: "nope", MessageID: "m9", Content: "x"})
	require.ErrorIs(t, err, schema.ErrNotFound)
}

func TestBadInputGetsClearErrorAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	b.createConversation(t, b.bob, "bobs")
	msgs := convPath("c1", "/messages")
	long := strings.Repeat("x", 201)
	cases := []struct {
		name   string
		token  string
		method string
		path   string
		body   any
		status int
		code   string
	}{
		{"malformed JSON", b.alice, "POST", msgs, `{"id": "m1", "content": `, 400, "bad_json"},
		{"not an object", b.alice, "POST", msgs, `["m1"]`, 400, "bad_json"},
		{"two objects", b.alice, "POST", msgs, `{"id":"m1","content":"a"} {}`, 400, "bad_json"},
		{"client sends status", b.alice, "POST", msgs, `{"id":"m1","content":"a","status":"done"}`, 400, "bad_json"},
		{"client sends attempts", b.alice, "POST", msgs, `{"id":"m1","content":"a","attempts":9}`, 400, "bad_json"},
		{"content missing", b.alice, "POST", msgs, `{"id":"m1"}`, 400, "bad_content"},
		{"content empty", b.alice, "POST", msgs, `{"id":"m1","content":""}`, 400, "bad_content"},
		{"content wrong type", b.alice, "POST", msgs, `{"id":"m1","content":5}`, 400, "bad_json"},
		{"content too large", b.alice, "POST", msgs, map[string]any{"id": "m1", "content": strings.Repeat("a", 1025)}, 413, "content_too_large"},
		{"body far too large", b.alice, "POST", msgs, map[string]any{"id": "m1", "content": strings.Repeat("a", 20000)}, 413, "body_too_large"},
		{"message id missing", b.alice, "POST", msgs, `{"content":"a"}`, 400, "bad_id"},
		{"message id empty", b.alice, "POST", msgs, `{"id":"","content":"a"}`, 400, "bad_id"},
		{"message id too long", b.alice, "POST", msgs, map[string]any{"id": long, "content": "a"}, 400, "bad_id"},
		{"message id control char", b.alice, "POST", msgs, map[string]any{"id": "a\nb", "content": "a"}, 400, "bad_id"},
		{"conversation id control char", b.alice, "POST", "/v1/conversations", map[string]any{"id": "a\x01"}, 400, "bad_id"},
		{"conversation id too long", b.alice, "POST", "/v1/conversations", map[string]any{"id": long}, 400, "bad_id"},
		{"conversation id in path too long", b.alice, "POST", convPath(long, "/messages"), map[string]any{"id": "m1", "content": "a"}, 400, "bad_id"},
		{"conversation unknown field", b.alice, "POST", "/v1/conversations", `{"id":"x","owner":"bob"}`, 400, "bad_json"},
		{"missing token", "", "POST", msgs, map[string]any{"id": "m1", "content": "a"}, 401, "unauthorized"},
		{"wrong token", "baton_wrong", "POST", msgs, map[string]any{"id": "m1", "content": "a"}, 401, "unauthorized"},
		{"unknown conversation", b.alice, "POST", convPath("nope", "/messages"), map[string]any{"id": "m1", "content": "a"}, 404, "not_found"},
		{"someone else's conversation", b.alice, "POST", convPath("bobs", "/messages"), map[string]any{"id": "m1", "content": "a"}, 404, "not_found"},
		{"conversation id with a leading space", b.alice, "POST", "/v1/conversations", map[string]any{"id": " c2"}, 400, "bad_id"},
		{"conversation id with a trailing space", b.alice, "POST", "/v1/conversations", map[string]any{"id": "c2 "}, 400, "bad_id"},
		{"conversation id in path with a trailing space", b.alice, "POST", convPath("c1 ", "/messages"), map[string]any{"id": "m1", "content": "a"}, 400, "bad_id"},
		{"message id with a leading tab-like space", b.alice, "POST", msgs, map[string]any{"id": "\u00a0m1", "content": "a"}, 400, "bad_id"},
		{"message id with a trailing space", b.alice, "POST", msgs, map[string]any{"id": "m1 ", "content": "a"}, 400, "bad_id"},
		{"delete unknown", b.alice, "DELETE", convPath("nope"), nil, 404, "not_found"},
		{"unknown endpoint", b.alice, "GET", "/v1/nothing", nil, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := counts(t, b.pool)
			r := b.do(t, tc.token, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, r.Status, r.Raw)
			errObj, ok := r.Body["error"].(map[string]any)
			require.True(t, ok, "errors are JSON {\"error\": {...}}: %s", r.Raw)
			require.Equal(t, tc.code, errObj["code"])
			require.NotEmpty(t, errObj["message"])
			require.Equal(t, before, counts(t, b.pool), "a rejected request changes no row")
		})
	}
}

func TestUsersSeeOnlyTheirOwnConversations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "private")
	require.Equal(t, http.StatusAccepted, b.do(t, b.alice, "POST", convPath("private", "/messages"), map[string]any{"id": "m1", "content": "secret"}).Status)
	before := counts(t, b.pool)

	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "GET", convPath("private"), nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "GET", convPath("private", "/messages"), nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "POST", convPath("private", "/messages"), map[string]any{"id": "m2", "content": "x"}).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, b.bob, "DELETE", convPath("private"), nil).Status)
	list := b.do(t, b.bob, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, list.Status)
	require.Empty(t, list.Body["conversations"])
	require.Equal(t, before, counts(t, b.pool))

	// The owner still sees everything, and can delete it (cascading).
	require.Len(t, b.do(t, b.alice, "GET", "/v1/conversations", nil).Body["conversations"], 1)
	require.Equal(t, http.StatusNoContent, b.do(t, b.alice, "DELETE", convPath("private"), nil).Status)
	require.Equal(t, [3]int{0, 0, 0}, counts(t, b.pool), "delete cascades to messages and outbox rows")
}

func TestIDsWithSubjectUnsafeCharactersRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []string{"a.b", "star*", "gt>", "with space", "Grüße-ñ-日本", "a/b"} {
		b.createConversation(t, b.alice, id)
		r := b.do(t, b.alice, "POST", convPath(id, "/messages"), map[string]any{"id": id + "#m", "content": "x"})
		require.Equal(t, http.StatusAccepted, r.Status, "id %q: %s", id, r.Raw)
		got := b.do(t, b.alice, "GET", convPath(id), nil)
		require.Equal(t, http.StatusOK, got.Status, "id %q", id)
		require.Equal(t, id, got.Body["id"])
	}
}

func TestCreateConversationIsIdempotentForItsOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	r := b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": "c1"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	gen := b.do(t, b.alice, "POST", "/v1/conversations", nil)
	require.Equal(t, http.StatusCreated, gen.Status, gen.Raw)
	require.NotEmpty(t, gen.Body["id"], "the server picks an id when none is given")
	require.Equal(t, 2, counts(t, b.pool)[0])
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusOK, b.do(t, "", "GET", "/healthz", nil).Status)
	require.Equal(t, http.StatusOK, b.do(t, "", "GET", "/readyz", nil).Status)
}
