package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestQuotasAnswer429AndOnlyForTheUserWhoReachedThem: past the
// conversations quota a user gets 429 and no row; past the retries quota
// 429 with Retry-After and the failed rows stay failed; another user is
// not affected.
func TestQuotasAnswer429AndOnlyForTheUserWhoReachedThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	alice, a, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	bob, _, err := schema.CreateToken(ctx, db.Pool, "bob")
	require.NoError(t, err)
	srv, err := api.New(api.Config{Quotas: api.Quotas{MaxConversations: 2, MaxRetriesPerHour: 1}}, db.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b := &bundle{pool: db.Pool, srv: hs, alice: alice, bob: bob, aliceID: a.ID, client: hs.Client()}

	b.createConversation(t, alice, "c1")
	b.createConversation(t, alice, "c2")
	before := counts(t, db.Pool)
	r := b.do(t, alice, "POST", "/v1/conversations", map[string]any{"id": "c3"})
	require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
	require.Equal(t, "quota_exceeded", r.Body["error"].(map[string]any)["code"])
	require.Equal(t, before, counts(t, db.Pool), "a refused creation writes nothing")
	require.Equal(t, http.StatusOK, b.do(t, alice, "POST", "/v1/conversations", map[string]any{"id": "c1"}).Status, "an existing conversation is not a new one")
	b.createConversation(t, bob, "c3") // bob's quota is his own

	// A failed turn: one retry per hour.
	require.Equal(t, http.StatusAccepted, b.do(t, alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "x"}).Status)
	fail := func() {
		_, err := db.Pool.Exec(ctx, `UPDATE agent_outbox SET status = 'error'`)
		require.NoError(t, err)
	}
	fail()
	r = b.do(t, alice, "POST", convPath("c1", "/retry"), nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.EqualValues(t, 1, r.Body["retried"])
	fail()
	r = b.do(t, alice, "POST", convPath("c1", "/retry"), nil)
	require.Equal(t, http.StatusTooManyRequests, r.Status, r.Raw)
	req, err := http.NewRequest("POST", hs.URL+convPath("c1", "/retry"), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+alice)
	resp, err := hs.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "429 carries Retry-After in seconds")
	require.Greater(t, secs, 3500)
	var failed int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM agent_outbox WHERE status = 'error'`).Scan(&failed))
	require.Equal(t, 1, failed, "a refused retry changes nothing")
}
