package securetest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// apiClient calls a running `baton api` over HTTP with a token.
type apiClient struct {
	base  string
	token string
	http  *http.Client
}

func newAPIClient(addr, token string) *apiClient {
	return &apiClient{base: "http://" + addr, token: token, http: &http.Client{Timeout: 10 * time.Second}}
}

// do sends a request with body (nil or a value sent as JSON) and returns
// the status and the decoded JSON answer.
func (a *apiClient) do(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out), "%s %s answered %d with a body that is not JSON: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// reply returns the content of the conversation's assistant message, or
// "" while there is none.
func (a *apiClient) reply(t *testing.T, conversation string) string {
	t.Helper()
	status, body := a.do(t, http.MethodGet, "/v1/conversations/"+conversation+"/messages", nil)
	require.Equal(t, http.StatusOK, status, "listing the messages: %v", body)
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		msg, _ := m.(map[string]any)
		if msg["role"] == "assistant" {
			content, _ := msg["content"].(string)
			return content
		}
		if msg["role"] == "error" {
			t.Fatalf("the turn failed instead of replying: %v", msg)
		}
	}
	return ""
}

// converse creates conversation, posts one message with content and
// waits for the echo agent's reply.
func (a *apiClient) converse(t *testing.T, conversation, content string, timeout time.Duration) {
	t.Helper()
	status, body := a.do(t, http.MethodPost, "/v1/conversations", map[string]string{"id": conversation, "title": "Secured"})
	require.Equal(t, http.StatusCreated, status, "creating the conversation: %v", body)
	status, body = a.do(t, http.MethodPost, "/v1/conversations/"+conversation+"/messages", map[string]string{"id": "m1", "content": content})
	require.Equal(t, http.StatusAccepted, status, "posting the message: %v", body)
	want := "echo: " + content
	eventually(t, timeout, func() (bool, string) {
		got := a.reply(t, conversation)
		return got == want, "the reply " + want + " (so far: " + strings.TrimSpace(got) + ")"
	})
}

// eventually polls cond, which reads external state (a server, a
// database) that offers no notification, until it holds or timeout
// passes; cond's text says what is awaited.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, what := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, still waiting for %s", timeout, what)
		}
		<-tick.C
	}
}
