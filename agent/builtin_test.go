package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
)

// call runs a registered tool the way the journal does.
func call(t *testing.T, tool agent.Tool, key, args string) (string, error) {
	t.Helper()
	tools := agent.NewRegistry(tool).Tools()
	return tools[tool.Name].Call(context.Background(), consumer.Invocation{IdempotencyKey: key, Arguments: json.RawMessage(args)})
}

func TestClockTellsTheTimeInTheAskedZone(t *testing.T) {
	t.Parallel()
	fixed := time.Date(2025, 3, 9, 12, 30, 0, 0, time.UTC)
	clock := agent.Clock(func() time.Time { return fixed })
	require.Equal(t, agent.Read, clock.Effect)
	out, err := call(t, clock, "", `{}`)
	require.NoError(t, err)
	require.Equal(t, "2025-03-09T12:30:00Z (Sunday)", out)
	out, err = call(t, clock, "", `{"time_zone":"Asia/Tokyo"}`)
	require.NoError(t, err)
	require.Equal(t, "2025-03-09T21:30:00+09:00 (Sunday)", out)
	_, err = call(t, clock, "", `{"time_zone":"Mars/Olympus"}`)
	require.ErrorContains(t, err, "unknown time zone")
}

func TestHTTPGetReadsOnlyAllowedHosts(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "secret") }))
	t.Cleanup(other.Close)
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
			return
		}
		_, _ = io.WriteString(w, "page "+r.URL.Path)
	}))
	t.Cleanup(allowed.Close)
	host := mustHost(t, allowed.URL)

	_, err := agent.HTTPGet(agent.HTTPGetConfig{})
	require.ErrorIs(t, err, agent.ErrInvalidTool, "an http_get without an allow-list must be refused")

	get, err := agent.HTTPGet(agent.HTTPGetConfig{AllowHosts: []string{host}, MaxBytes: 8})
	require.NoError(t, err)
	require.Equal(t, agent.Read, get.Effect)
	out, err := call(t, get, "", `{"url":"`+allowed.URL+`/docs"}`)
	require.NoError(t, err)
	require.Equal(t, "HTTP 200\npage /do\n[truncated at 8 bytes]", out)

	_, err = call(t, get, "", `{"url":"`+other.URL+`/"}`)
	require.ErrorContains(t, err, "is not allowed")
	_, err = call(t, get, "", `{"url":"`+allowed.URL+`/redirect"}`)
	require.ErrorContains(t, err, "is not allowed", "a redirect must not leave the allowed hosts")
	_, err = call(t, get, "", `{"url":"file:///etc/passwd"}`)
	require.Error(t, err)
}

func mustHost(t *testing.T, raw string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}

func TestWebhookSendsTheIdempotencyKeyAndRetriesWithIt(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	var bodies []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		bodies = append(bodies, string(b))
		first := len(keys) == 1
		mu.Unlock()
		if first {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ticket 7")
	}))
	t.Cleanup(hook.Close)

	tool, err := agent.Webhook(agent.WebhookConfig{URL: hook.URL, Name: "open_ticket", RetryDelay: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, agent.Write, tool.Effect)
	out, err := call(t, tool, "op_abc", `{"payload":{"title":"printer"}}`)
	require.NoError(t, err)
	require.Contains(t, out, "delivered (HTTP 200) ticket 7")
	require.Equal(t, []string{"op_abc", "op_abc"}, keys, "a retried delivery must carry the same Idempotency-Key")
	require.JSONEq(t, `{"payload":{"title":"printer"}}`, bodies[1])

	_, err = agent.Webhook(agent.WebhookConfig{URL: "not a url"})
	require.ErrorIs(t, err, agent.ErrInvalidTool)
}

func TestBuiltinsOfferOnlyWhatIsConfigured(t *testing.T) {
	t.Parallel()
	reg, err := agent.Builtins{}.Registry()
	require.NoError(t, err)
	require.Equal(t, []string{"clock"}, reg.Names())
	reg, err = agent.Builtins{HTTPGetAllow: []string{"example.org"}, WebhookURL: "http://127.0.0.1:9/hook"}.Registry()
	require.NoError(t, err)
	require.Equal(t, []string{"clock", "http_get", "webhook"}, reg.Names())
	require.Equal(t, agent.Write, reg.Tools()["webhook"].Effect())
	_, err = agent.Builtins{WebhookURL: "ftp://x"}.Registry()
	require.ErrorIs(t, err, agent.ErrInvalidTool)
}
