package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestWithoutAWritablePrimaryTheAPIAnswers503WithRetryAfter: while no
// primary is reachable (the database down, or only a standby reached
// during a failover), a request gets 503 with Retry-After and a message
// that says to retry, not a 500 with a driver error; after the failover
// the same message id, sent again, is stored once.
func TestWithoutAWritablePrimaryTheAPIAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ha := testenv.PrimaryWithStandby(t, testenv.HAOptions{})
	tok, _, err := schema.CreateToken(ctx, ha.DB.Pool, "alice")
	require.NoError(t, err)
	_, err = ha.DB.Pool.Exec(ctx, `UPDATE api_tokens SET last_used_at = now()`) // no write needed to authenticate
	require.NoError(t, err)
	require.NoError(t, ha.Primary.WaitCaughtUp(ctx, ha.Standby))

	check := func(pool *pgxpool.Pool, path string, body any) {
		t.Helper()
		srv, err := api.New(api.Config{}, pool, nil)
		require.NoError(t, err)
		hs := httptest.NewServer(srv)
		defer hs.Close()
		b := &bundle{pool: pool, srv: hs, alice: tok, client: hs.Client()}
		r := b.do(t, tok, "POST", path, body)
		require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
		require.Equal(t, "unavailable", r.Body["error"].(map[string]any)["code"])
		require.NotContains(t, r.Raw, "SQLSTATE")
		require.NotContains(t, r.Raw, "127.0.0.1")
		req, err := http.NewRequest("POST", hs.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hs.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, "2", resp.Header.Get("Retry-After"))
	}
	// Only the standby: it cannot write.
	standby, err := pgxpool.New(ctx, ha.Standby.URL(ha.DB.Name))
	require.NoError(t, err)
	t.Cleanup(standby.Close)
	check(standby, "/v1/conversations", map[string]any{"id": "c"})
	// Nothing reachable.
	down, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/baton?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(down.Close)
	check(down, "/v1/conversations", map[string]any{"id": "c"})

	// After the failover, the multi-host URL finds the new primary, and a
	// client's retry of the same message id is stored once.
	ha.Failover(t)
	srv, err := api.New(api.Config{}, ha.DB.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b := &bundle{pool: ha.DB.Pool, srv: hs, alice: tok, client: hs.Client()}
	deadline := time.Now().Add(30 * time.Second)
	var r response
	for {
		r = b.do(t, tok, "POST", "/v1/conversations", map[string]any{"id": "c"})
		if r.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the client honours Retry-After, shortened
	}
	require.Less(t, r.Status, 300, r.Raw)
	for range 2 {
		r = b.do(t, tok, "POST", convPath("c", "/messages"), map[string]any{"id": "m1", "content": "hi"})
		require.Less(t, r.Status, 300, r.Raw)
	}
	require.Equal(t, [3]int{1, 1, 1}, counts(t, ha.DB.Pool), "one message, one outbox row, whatever the retries")
}
