package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWrongMethodOnARouteIsAJSON405WithAllow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "demo")
	for _, c := range []struct {
		method, path, allow string
	}{
		{http.MethodPut, "/v1/conversations", "GET, HEAD, POST"},
		{http.MethodPut, convPath("demo"), "GET, HEAD, PATCH, DELETE"},
		{http.MethodDelete, convPath("demo", "/messages"), "GET, HEAD, POST"},
		{http.MethodGet, convPath("demo", "/retry"), "POST"},
		{http.MethodPost, convPath("demo", "/events"), "GET, HEAD"},
		{http.MethodPost, "/healthz", "GET, HEAD"},
		{http.MethodDelete, "/", "GET, HEAD"},
	} {
		req, err := http.NewRequest(c.method, b.srv.URL+c.path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+b.alice)
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", c.method, c.path)
		require.Equal(t, c.allow, resp.Header.Get("Allow"), "%s %s", c.method, c.path)
		require.Contains(t, resp.Header.Get("Content-Type"), "application/json", "%s %s", c.method, c.path)

		r := b.do(t, b.alice, c.method, c.path, nil)
		errBody, _ := r.Body["error"].(map[string]any)
		require.Equal(t, "method_not_allowed", errBody["code"], "%s %s: %s", c.method, c.path, r.Raw)
		require.Contains(t, errBody["message"], c.method, "the message names the method")
	}
}

func TestUnknownPathIsAJSON404(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/v1/nothing", "/v1/conversations/demo/nothing", "/nothing"} {
		r := b.do(t, b.alice, http.MethodGet, path, nil)
		require.Equal(t, http.StatusNotFound, r.Status, path)
		errBody, _ := r.Body["error"].(map[string]any)
		require.Equal(t, "not_found", errBody["code"], "%s: %s", path, r.Raw)
	}
}
