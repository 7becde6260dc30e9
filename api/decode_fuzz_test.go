package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzDecodeJSON: whatever body a client sends, decoding never panics,
// answers with the JSON error format when it refuses, and accepts only one
// JSON object of known fields within the size limit.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{`{"id":"m1","content":"hi"}`, ``, `   `, `{"id":"m1","content":`, `["m1"]`, `{"id":"m1","content":"a"} {}`,
		`{"id":"m1","content":"a","status":"done"}`, `{"id":5}`, `null`, `{"content":"\u0000"}`, strings.Repeat(`{"id":`, 100)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/conversations/c/messages", strings.NewReader(body))
		var req postMessageRequest
		ok := decodeJSON(w, r, 4096, false, &req)
		if !ok {
			var e errorBody
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("refused %q without a JSON error: %d %s", body, w.Code, w.Body.String())
			}
			if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("refused %q with status %d", body, w.Code)
			}
			return
		}
		if len(body) > 4096 {
			t.Fatalf("accepted a body of %d bytes over the limit", len(body))
		}
		// Accepted: the body is one JSON object with only known fields.
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &fields); err != nil {
			t.Fatalf("accepted %q, which is not one JSON object: %v", body, err)
		}
		for k := range fields {
			if k != "id" && k != "content" && !strings.EqualFold(k, "id") && !strings.EqualFold(k, "content") {
				t.Fatalf("accepted %q with unknown field %q", body, k)
			}
		}
	})
}
