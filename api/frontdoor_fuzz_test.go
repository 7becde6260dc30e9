package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The front door under fuzzing: whatever body or path id a client sends
// to a route of the API, the answer is never a 500 (nor a server error
// in the log), a refusal (4xx) writes nothing, and the server goes on
// serving. `make test` runs each target's seeds, which hold the defects
// found before (U+0000, invalid UTF-8, unpaired surrogates, "." and "..",
// ids of the server's, bodies over their limit); `make fuzz` fuzzes each
// for a while.

// frontDoor is a server without NATS (the chat routes refuse what they
// would stream with 503, after every check) and a conversation c1 of
// alice's with one message.
type frontDoor struct {
	*bundle
	logs *lockedBuffer
}

func newFrontDoor(f *testing.F) *frontDoor {
	f.Helper()
	b, logs := setupLogged(f)
	b.createConversation(f, b.alice, "c1")
	return &frontDoor{bundle: b, logs: logs}
}

// try sends one request and checks what every request must give.
func (d *frontDoor) try(t *testing.T, method, path, body string) {
	req, err := http.NewRequest(method, d.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return // not a request a client can send
	}
	req.Header.Set("Authorization", "Bearer "+d.alice)
	req.Header.Set("Content-Type", "application/json")
	before := counts(t, d.pool)
	resp, err := d.client.Do(req)
	require.NoError(t, err, "%s %s %q", method, path, body)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NotEqual(t, http.StatusInternalServerError, resp.StatusCode, "%s %s %q: %s", method, path, body, raw)
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.Unmarshal(raw, &e), "%s %s %q: a refusal is the JSON error format: %s", method, path, body, raw)
		require.NotEmpty(t, e.Error.Code)
		if resp.StatusCode >= 500 {
			// Only what this server cannot do without NATS: a chat's
			// stream, after every check of the request.
			require.Equal(t, "no_live_events", e.Error.Code, "%s %s %q: %s", method, path, body, raw)
		}
		require.Equal(t, before, counts(t, d.pool), "%s %s %q: refused with %d, and wrote nothing", method, path, body, resp.StatusCode)
	}
	require.NotContains(t, d.logs.String(), `"level":"error"`, "%s %s %q: no server error", method, path, body)
	health, err := d.client.Get(d.srv.URL + "/healthz")
	require.NoError(t, err, "the server goes on serving")
	health.Body.Close()
	require.Equal(t, http.StatusOK, health.StatusCode)
}

// textSeeds are strings that broke the front door, for any field.
var textSeeds = []string{"hi", "", ".", "..", "reply_1", "error_x", "ap_x", `a\u0000b`, "\xff", "a\xc3", `\ud800`, `\udfff`, `\ud83d\ude00`,
	`\ud800\u0041`, " x", "x ", "a/b", "%2e", strings.Repeat("x", 201)}

func FuzzPostMessageBody(f *testing.F) {
	d := newFrontDoor(f)
	for _, s := range textSeeds {
		f.Add(`{"id":"` + s + `","content":"hi"}`)
		f.Add(`{"id":"m-seed","content":"` + s + `"}`)
	}
	f.Add(`{"id":"m1","content":"` + strings.Repeat("x", 20<<10) + `"}`)
	f.Add(`{"id":"m1","content":"hi","status":"done"}`)
	f.Fuzz(func(t *testing.T, body string) { d.try(t, "POST", "/v1/conversations/c1/messages", body) })
}

func FuzzCreateConversationBody(f *testing.F) {
	d := newFrontDoor(f)
	for _, s := range textSeeds {
		f.Add(`{"id":"` + s + `"}`)
		f.Add(`{"id":"c-seed","title":"` + s + `"}`)
	}
	f.Add(`{"title":"` + strings.Repeat("x", 20<<10) + `"}`)
	f.Fuzz(func(t *testing.T, body string) { d.try(t, "POST", "/v1/conversations", body) })
}

func FuzzChatBody(f *testing.F) {
	d := newFrontDoor(f)
	for _, s := range textSeeds {
		f.Add(chatRaw(s, "m1", "hi"))
		f.Add(chatRaw("c1", s, "hi"))
		f.Add(chatRaw("c1", "m1", s))
		f.Add(approvalRaw("c1", s))
	}
	f.Add(chatRaw("c1", "m1", strings.Repeat("x", 70<<10)))
	f.Add(`{"id":"c1","trigger":"regenerate-message","messageId":"reply_1","repeat_writes":"yes","messages":[]}`)
	f.Add(`{"id":"c1","messages":[{"id":"h","role":"user","parts":[{"type":"text","text":"x"}]},`)
	f.Fuzz(func(t *testing.T, body string) { d.try(t, "POST", "/v1/chat", body) })
}

func FuzzDecisionBody(f *testing.F) {
	d := newFrontDoor(f)
	for _, s := range textSeeds {
		f.Add(`{"answer":"` + s + `"}`)
		f.Add(`{"approved":true,"arguments_sha256":"` + s + `"}`)
	}
	f.Add(`{"answer":{"a\u0000":1}}`)
	f.Add(`{"approved":"yes"}`)
	f.Fuzz(func(t *testing.T, body string) { d.try(t, "POST", "/v1/conversations/c1/approvals/ap_x", body) })
}

func FuzzRetryBody(f *testing.F) {
	d := newFrontDoor(f)
	for _, seed := range []string{``, `{}`, `{"repeat_writes":true}`, `{"repeat_writes":"yes"}`, `{"status":"pending"}`, `[]`, "\xff", `{"repeat_writes":true} {}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) { d.try(t, "POST", "/v1/conversations/c1/retry", body) })
}

// FuzzPathIDs: an id in a path, raw (as a client may send it, escaped or
// not) and escaped, on every route that takes one.
func FuzzPathIDs(f *testing.F) {
	d := newFrontDoor(f)
	for _, s := range textSeeds {
		f.Add(s)
	}
	f.Add("%00")
	f.Add("%ff")
	f.Add("%2e%2e")
	f.Add("ap_%00")
	f.Fuzz(func(t *testing.T, id string) {
		for _, seg := range []string{url.PathEscape(id), id} {
			for _, r := range []struct{ method, path, body string }{
				{"GET", "/v1/conversations/" + seg, ""},
				{"GET", "/v1/conversations/" + seg + "/messages?after=" + url.QueryEscape(id), ""},
				{"POST", "/v1/conversations/" + seg + "/messages", `{"id":"m1","content":"hi"}`},
				{"POST", "/v1/conversations/" + seg + "/read", ""},
				{"POST", "/v1/conversations/" + seg + "/stop", ""},
				{"GET", "/v1/conversations/" + seg + "/approvals", ""},
				{"POST", "/v1/conversations/c1/approvals/" + seg, `{"approved":true}`},
				{"GET", "/v1/chat/" + seg + "?before=" + url.QueryEscape(id), ""},
				{"GET", "/v1/chat/" + seg + "/stream", ""},
				{"DELETE", "/v1/conversations/" + seg + "x", ""},
			} {
				d.try(t, r.method, r.path, r.body)
			}
		}
	})
}
