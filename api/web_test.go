package api_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThePageForbidsInlineCodeAndFraming(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/", "/app.js", "/app.css"} {
		resp, err := b.client.Get(b.srv.URL + path)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		csp := resp.Header.Get("Content-Security-Policy")
		require.NotContains(t, csp, "unsafe-inline", path)
		require.NotContains(t, csp, "unsafe-eval", path)
		require.Contains(t, csp, "script-src 'self'", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
		if path == "/" {
			page := string(raw)
			require.Contains(t, page, `<script src="/app.js"></script>`)
			require.NotContains(t, page, "<style", "no inline style sheet")
			require.NotContains(t, page, "style=", "no inline style attribute")
			require.Equal(t, 1, strings.Count(page, "<script"), "the one script is the file")
			require.NotRegexp(t, `\son[a-z]+=`, page, "no inline event handler")
		}
	}
}
