package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/secretscan"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// TestNoMCPCredentialReachesAnyOutput runs real workers, at debug level,
// with an MCP server's bearer token from --mcp-token-file and a key in its
// URL's query, working and failing (a call that times out, a server that
// is not there), and searches everything they print, and what the user
// reads, for both secrets.
func TestNoMCPCredentialReachesAnyOutput(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	random := func() string {
		b := make([]byte, 12)
		_, err := rand.Read(b)
		require.NoError(t, err)
		return hex.EncodeToString(b)
	}
	token, query := "tok-"+random(), "qk-"+random()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	secrets := []secretscan.Secret{{Name: "MCP bearer token", Value: token}, {Name: "MCP URL key", Value: query}}

	s := newStack(t)
	events := s.events()
	f := newFaultServer(t)
	model := agenttest.NewResponder(t, toolResultEcho(func(user string) (string, string) { return "f__" + user, `{"text":"x"}` }))
	common := []string{"--log-level", "debug", "--mcp-token-file", "f=" + tokenFile, "--mcp-server-timeout", "f=1s"}

	// Working, then a write that times out: the URL carries the key.
	w := s.startWorkerProcessURL(bin, model, f.endpoint()+"?api_key="+query, common...)
	s.send("ok", "m-ok", "count")
	require.Equal(t, batonnats.EventReplied, awaitEvent(t, events, "ok", batonnats.EventReplied, batonnats.EventFailed).Type, w.stderr.String())
	s.send("slow", "m-slow", "hang")
	require.Equal(t, batonnats.EventFailed, awaitEvent(t, events, "slow", batonnats.EventReplied, batonnats.EventFailed).Type, w.stderr.String())
	w.kill(t)

	// A server that is not there, with the key in its URL.
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL + "/mcp?api_key=" + query
	down.Close()
	w2 := s.startWorkerProcessURL(bin, model, downURL, common...)
	s.send("down", "m-down", "count")
	require.Equal(t, batonnats.EventReplied, awaitEvent(t, events, "down", batonnats.EventReplied, batonnats.EventFailed).Type, w2.stderr.String())
	w2.kill(t)
	require.Contains(t, w2.stderr.String(), "MCP server unavailable", "the down server has its operator's line")
	f.mu.Lock()
	require.Equal(t, "Bearer "+token, f.auth, "the server got the token from the file")
	f.mu.Unlock()
	var userText []string
	rows, err := s.db.Pool.Query(context.Background(), `SELECT content FROM messages UNION ALL SELECT coalesce(error, '') || coalesce(result, '') FROM operations UNION ALL SELECT coalesce(error, '') FROM mcp_servers`)
	require.NoError(t, err)
	for rows.Next() {
		var text string
		require.NoError(t, rows.Scan(&text))
		userText = append(userText, text)
	}
	rows.Close()
	for _, out := range []struct{ name, text string }{{"first worker", w.stderr.String()}, {"second worker", w2.stderr.String()}, {"messages and journal", strings.Join(userText, "\n")}} {
		for _, line := range strings.Split(out.text, "\n") {
			for _, sec := range secrets {
				require.Empty(t, sec.In(line), "%s printed the %s: %s", out.name, sec.Name, secretscan.MaskAll(line, secrets))
			}
		}
	}
	require.Contains(t, w.stderr.String(), "MCP write failed with its outcome unknown", "the failing call has its operator's line")
	require.Contains(t, w2.stderr.String(), `"server":"`+strings.TrimSuffix(downURL, "?api_key="+query)+`"`, "the failing server is named, without its key")
}
