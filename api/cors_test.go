package api_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func corsRequest(t *testing.T, srv *httptest.Server, method, path, origin string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	require.NoError(t, err)
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// TestCORSLetsTheListedOriginAndNoOtherCallTheAPIFromABrowser: with
// CORSOrigins https://app.example, a preflight from it is allowed with
// Authorization, one from any other origin is refused; answers to the
// listed origin carry its name, the headers a client reads and Vary:
// Origin, and answers to another carry no CORS header. Without
// CORSOrigins nothing changes: no cross-origin access.
func TestCORSLetsTheListedOriginAndNoOtherCallTheAPIFromABrowser(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	token, _, err := schema.CreateToken(t.Context(), db.Pool, "alice")
	require.NoError(t, err)
	s, err := api.New(api.Config{CORSOrigins: []string{"https://app.example"}}, db.Pool, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	preflight := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}

	for _, path := range []string{"/v1/conversations", "/v1/conversations/demo/messages", "/v1/conversations/demo/events"} {
		resp := corsRequest(t, srv, "OPTIONS", path, "https://app.example", preflight)
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "a preflight of %s from the listed origin", path)
		require.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
		require.Contains(t, resp.Header.Get("Access-Control-Allow-Headers"), "Authorization")
		require.Contains(t, resp.Header.Get("Access-Control-Allow-Methods"), "POST")
		require.Contains(t, resp.Header.Values("Vary"), "Origin")
		require.Empty(t, resp.Header.Get("Access-Control-Allow-Credentials"), "bearer tokens, never cookies")

		for _, other := range []string{"https://evil.example", "https://app.example:8443", "http://app.example", "null"} {
			resp := corsRequest(t, srv, "OPTIONS", path, other, preflight)
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "a preflight of %s from %s", path, other)
			require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "no CORS header for %s", other)
		}
	}

	resp := corsRequest(t, srv, "GET", "/v1/conversations", "https://app.example", map[string]string{"Authorization": "Bearer " + token})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, resp.Header.Values("Vary"), "Origin")
	for _, h := range []string{"Retry-After", "Location", "WWW-Authenticate", "x-vercel-ai-ui-message-stream"} {
		require.Contains(t, resp.Header.Get("Access-Control-Expose-Headers"), h, "a page can read %s", h)
	}
	resp = corsRequest(t, srv, "GET", "/v1/conversations", "https://app.example", nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"), "the page can read why it was refused")
	resp = corsRequest(t, srv, "GET", "/v1/conversations", "https://evil.example", map[string]string{"Authorization": "Bearer " + token})
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "another origin's page cannot read the answer")
	resp = corsRequest(t, srv, "GET", "/", "https://app.example", nil)
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "the web page is not part of CORS")

	off, err := api.New(api.Config{}, db.Pool, nil)
	require.NoError(t, err)
	offSrv := httptest.NewServer(off)
	t.Cleanup(offSrv.Close)
	resp = corsRequest(t, offSrv, "OPTIONS", "/v1/conversations", "https://app.example", preflight)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "without CORSOrigins a preflight is not answered")
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))
	resp = corsRequest(t, offSrv, "GET", "/v1/conversations", "https://app.example", map[string]string{"Authorization": "Bearer " + token})
	require.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"), "off by default")
}

func TestCORSOriginsAreExactOriginsWithoutWildcards(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"*", "https://*.example", "https://app.example/", "https://app.example/chat", "app.example", "HTTPS://App.example", "https://u:p@app.example"} {
		err := api.Config{CORSOrigins: []string{bad}}.WithDefaults().Validate()
		var se *setting.Error
		require.True(t, errors.As(err, &se), "%q should be refused, got %v", bad, err)
		require.Equal(t, "CORSOrigins", se.Field)
	}
	require.ErrorContains(t, api.Config{CORSOrigins: []string{"*"}}.WithDefaults().Validate(), "wildcards are not allowed")
	require.NoError(t, api.Config{CORSOrigins: []string{"https://app.example", "http://localhost:3000"}}.WithDefaults().Validate())
}
