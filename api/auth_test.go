package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestEveryRouteRefusesEveryWrongCredentialAndChangesNothing is the auth
// matrix: every route of the API against every way a request can lack the
// right to it. Each gets its status, changes no row and shows nothing of
// another user's data.
func TestEveryRouteRefusesEveryWrongCredentialAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// Alice's data, which no request below may see or change.
	const (
		cid     = "alice-conv"
		title   = "alice-secret-title"
		content = "alice-secret-content"
		msgID   = "alice-secret-message"
	)
	r := b.do(t, b.alice, "POST", "/v1/conversations", map[string]any{"id": cid, "title": title})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	r = b.do(t, b.alice, "POST", convPath(cid, "/messages"), map[string]any{"id": msgID, "content": content,
		"files": []map[string]any{{"mediaType": "text/plain", "url": "data:text/plain;base64,YWxpY2Utc2VjcmV0LWZpbGUK"}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	aliceFile := r.Body["files"].([]any)[0].(map[string]any)["sha256"].(string)
	// A failed turn, so that a retry would have something to change.
	_, err := b.pool.Exec(ctx, `UPDATE agent_outbox SET status = 'error', attempts = 3`)
	require.NoError(t, err)

	revoked, u, err := schema.CreateToken(ctx, b.pool, "alice")
	require.NoError(t, err)
	_, err = schema.RevokeToken(ctx, b.pool, u.TokenID)
	require.NoError(t, err)
	expired, u, err := schema.CreateToken(ctx, b.pool, "alice")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE api_tokens SET expires_at = now() - interval '1 minute' WHERE id = $1`, u.TokenID)
	require.NoError(t, err)
	// Well formed, never issued.
	wrong := "baton_AAAAAAAA_" + strings.Repeat("x", 43)

	routes := []struct {
		method, path string
		body         string
		// ownedBy: the route names a conversation, so another user's
		// token gets 404.
		ownedBy bool
	}{
		{"POST", "/v1/conversations", `{"id":"new-conv","title":"new"}`, false},
		{"GET", "/v1/conversations", "", false},
		{"GET", convPath(cid), "", true},
		{"PATCH", convPath(cid), `{"double_texting":"reject"}`, true},
		{"DELETE", convPath(cid), "", true},
		{"POST", convPath(cid, "/messages"), `{"id":"new-message","content":"new"}`, true},
		{"GET", convPath(cid, "/messages"), "", true},
		{"POST", convPath(cid, "/read"), "", true},
		{"POST", convPath(cid, "/retry"), "", true},
		{"GET", convPath(cid, "/events"), "", true},
		{"POST", convPath(cid, "/stop"), "", true},
		{"POST", "/v1/chat", `{"id":"new-chat","messages":[{"id":"new-message","role":"user","parts":[{"type":"text","text":"new"}]}]}`, false},
		{"GET", "/v1/chat/" + cid, "", true},
		{"GET", "/v1/chat/" + cid + "/stream", "", true},
		// A file: another user's token finds nothing at its address.
		{"GET", "/v1/files/" + aliceFile, "", true},
	}
	type credential struct {
		name          string
		authorization string // the Authorization header, if any
	}
	refused := []credential{
		{name: "no token"},
		{name: "malformed header: another scheme", authorization: "Basic YWxpY2U6cGFzcw=="},
		{name: "malformed header: no token", authorization: "Bearer "},
		{name: "malformed header: two tokens", authorization: "Bearer " + b.alice + " " + b.alice},
		{name: "malformed header: no scheme", authorization: b.alice},
		{name: "wrong token", authorization: "Bearer " + wrong},
		{name: "revoked token", authorization: "Bearer " + revoked},
		{name: "expired token", authorization: "Bearer " + expired},
	}

	// Secrets no answer may contain: Alice's data and tokens.
	secrets := []string{title, content, msgID, b.alice, revoked, expired, `"alice"`, "alice-secret-file"}
	check := func(t *testing.T, method, path, body, authorization string, want int) string {
		t.Helper()
		before := counts(t, b.pool)
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, b.srv.URL+path, rd)
		require.NoError(t, err)
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, want, resp.StatusCode, "%s %s: %s", method, path, raw)
		require.Equal(t, "application/json; charset=utf-8", resp.Header.Get("Content-Type"), "errors are JSON")
		require.Contains(t, string(raw), `"error":{"code":`)
		if want == http.StatusUnauthorized {
			require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
		}
		for _, s := range secrets {
			require.NotContains(t, string(raw), s, "the answer shows nothing of another user")
		}
		require.Equal(t, before, counts(t, b.pool), "a refused request changes no row")
		return string(raw)
	}

	for _, rt := range routes {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			for _, c := range refused {
				t.Run(c.name, func(t *testing.T) {
					check(t, rt.method, rt.path, rt.body, c.authorization, http.StatusUnauthorized)
				})
			}
			sep := "?"
			if strings.Contains(rt.path, "?") {
				sep = "&"
			}
			if !strings.HasSuffix(rt.path, "/events") {
				t.Run("query-string token outside the events route", func(t *testing.T) {
					raw := check(t, rt.method, rt.path+sep+"access_token="+b.alice, rt.body, "", http.StatusUnauthorized)
					require.Contains(t, raw, "Authorization header", "the answer says where the token goes")
				})
				t.Run("query-string token beside a valid header outside the events route", func(t *testing.T) {
					check(t, rt.method, rt.path+sep+"access_token="+b.alice, rt.body, "Bearer "+b.alice, http.StatusUnauthorized)
				})
			}
			if rt.ownedBy {
				t.Run("another user's conversation", func(t *testing.T) {
					check(t, rt.method, rt.path, rt.body, "Bearer "+b.bob, http.StatusNotFound)
				})
				if strings.HasSuffix(rt.path, "/events") {
					t.Run("another user's conversation with a query-string token", func(t *testing.T) {
						check(t, rt.method, rt.path+sep+"access_token="+b.bob, rt.body, "", http.StatusNotFound)
					})
				}
			}
		})
	}

	// Bob's list holds nothing of Alice's.
	list := b.do(t, b.bob, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, list.Status)
	for _, s := range append(secrets, cid) {
		require.NotContains(t, list.Raw, s)
	}
	// And Alice's data is all there still.
	got := b.do(t, b.alice, "GET", convPath(cid, "/messages"), nil)
	require.Equal(t, http.StatusOK, got.Status)
	require.Contains(t, got.Raw, content)
}

func TestARevokedTokenIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tok, u, err := schema.CreateToken(ctx, b.pool, "carol")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, b.do(t, tok, "GET", "/v1/conversations", nil).Status)
	active, err := schema.TokenActive(ctx, b.pool, u.TokenID)
	require.NoError(t, err)
	require.True(t, active)

	_, err = schema.RevokeToken(ctx, b.pool, u.TokenID)
	require.NoError(t, err)
	r := b.do(t, tok, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "the first request after the revocation is refused")
	require.Contains(t, r.Raw, "revoked")
	active, err = schema.TokenActive(ctx, b.pool, u.TokenID)
	require.NoError(t, err)
	require.False(t, active, "an event stream checking its token again sees the revocation")

	// Alice's other token still works.
	require.Equal(t, http.StatusOK, b.do(t, b.alice, "GET", "/v1/conversations", nil).Status)
}

func TestATokenStopsWorkingWhenItExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tok, u, err := schema.CreateTokenUntil(ctx, b.pool, "dave", time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), u.TokenExpiresAt, time.Minute)
	require.Equal(t, http.StatusOK, b.do(t, tok, "GET", "/v1/conversations", nil).Status)

	_, err = b.pool.Exec(ctx, `UPDATE api_tokens SET expires_at = now() WHERE id = $1`, u.TokenID)
	require.NoError(t, err)
	r := b.do(t, tok, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
	require.Contains(t, r.Raw, "expired")
	active, err := schema.TokenActive(ctx, b.pool, u.TokenID)
	require.NoError(t, err)
	require.False(t, active)

	unknown, err := schema.TokenActive(ctx, b.pool, u.TokenID+1000)
	require.NoError(t, err)
	require.False(t, unknown, "a token that does not exist is not active")

	_, _, err = schema.CreateTokenUntil(ctx, b.pool, "dave", time.Now().Add(-time.Minute))
	require.ErrorContains(t, err, "not in the future")
}

func TestAuthenticateRecordsTheLastUseAndTheTokenItCameWith(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tok, created, err := schema.CreateToken(ctx, b.pool, "erin")
	require.NoError(t, err)
	require.Regexp(t, `^baton_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{43}$`, tok)
	list, err := schema.ListTokens(ctx, b.pool, "erin")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Nil(t, list[0].LastUsedAt)
	require.True(t, strings.HasPrefix(tok, "baton_"+list[0].PublicID+"_"), "the token's public id is the start of the token")

	u, err := schema.Authenticate(ctx, b.pool, tok)
	require.NoError(t, err)
	require.Equal(t, created.TokenID, u.TokenID)
	require.True(t, u.TokenExpiresAt.IsZero(), "the token never expires")
	list, err = schema.ListTokens(ctx, b.pool, "erin")
	require.NoError(t, err)
	require.NotNil(t, list[0].LastUsedAt, "the use is recorded")
	require.Equal(t, "active", list[0].State(time.Now()))
}

// TestAnOperatorsTokenIsRefusedByTheAPI: a token of `baton token create
// --admin` signs in to the console only; the API answers 401 and says so,
// and records no use of it.
func TestAnOperatorsTokenIsRefusedByTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tok, _, err := schema.CreateOperatorToken(ctx, b.pool, "ops-ada", schema.RoleAdmin, time.Time{})
	require.NoError(t, err)
	r := b.do(t, tok, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
	require.Contains(t, r.Raw, "console")
	list, err := schema.ListTokens(ctx, b.pool, "ops-ada")
	require.NoError(t, err)
	require.Equal(t, schema.RoleAdmin, list[0].OperatorRole)
	require.Nil(t, list[0].LastUsedAt, "the API records no use of it")
}
