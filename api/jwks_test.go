package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
)

// TestTheAgentKeysAreServedWithoutATokenAndVerifyTheWorkersTokens: an
// agent fetches /.well-known/jwks.json without a token, may cache it, and
// verifies with it a token signed by the worker's key; a server with no
// agent key answers 404.
func TestTheAgentKeysAreServedWithoutATokenAndVerifyTheWorkersTokens(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	dir := t.TempDir()
	oldKey, err := jwtauth.CreateKeyPair(filepath.Join(dir, "old.key"), filepath.Join(dir, "old.pub"), false)
	require.NoError(t, err)
	newKey, err := jwtauth.CreateKeyPair(filepath.Join(dir, "new.key"), filepath.Join(dir, "new.pub"), false)
	require.NoError(t, err)
	keys, err := jwtauth.LoadPublicKeys(filepath.Join(dir, "old.pub"), filepath.Join(dir, "new.pub"))
	require.NoError(t, err)
	s, err := api.New(api.Config{AgentKeys: keys}, db.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	resp, err := http.Get(hs.URL + "/.well-known/jwks.json")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, "public, max-age=300", resp.Header.Get("Cache-Control"))
	var set jose.JSONWebKeySet
	require.NoError(t, json.Unmarshal(body, &set))
	require.Len(t, set.Keys, 2, "both keys of a rotation: %s", body)

	for _, k := range []*jwtauth.SigningKey{oldKey, newKey} {
		token, err := k.Sign(jwtauth.StepClaims{Audience: "https://agent.example", Subject: "alice",
			Conversation: "c_1", Turn: "t_1", Step: "step_1", Expiry: time.Now().Add(time.Minute)})
		require.NoError(t, err)
		tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
		require.NoError(t, err)
		found := set.Key(tok.Headers[0].KeyID)
		require.Len(t, found, 1, "the served set has the key of kid %s", tok.Headers[0].KeyID)
		var c jwt.Claims
		require.NoError(t, tok.Claims(found[0].Key, &c), "the token verifies with the served key")
		require.Equal(t, "alice", c.Subject)
	}

	head, err := http.Head(hs.URL + "/.well-known/jwks.json")
	require.NoError(t, err)
	head.Body.Close()
	require.Equal(t, http.StatusOK, head.StatusCode)
	post, err := http.Post(hs.URL+"/.well-known/jwks.json", "application/json", nil)
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)

	none, err := api.New(api.Config{}, db.Pool, nil)
	require.NoError(t, err)
	hs2 := httptest.NewServer(none)
	t.Cleanup(hs2.Close)
	resp, err = http.Get(hs2.URL + "/.well-known/jwks.json")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "no agent key configured: %s", body)
	require.Contains(t, string(body), "not_found")
}
