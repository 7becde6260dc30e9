package schema_test

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/batonhq/baton/schema"
)

// FuzzValidateID: whatever a client sends as an id, ValidateID never
// panics, and every id it accepts is 1 to 200 characters of valid UTF-8
// without control characters or surrounding whitespace: what the
// database's length checks, NATS headers and the page can all hold.
func FuzzValidateID(f *testing.F) {
	for _, seed := range []string{"demo", "", " demo", "demo ", "a.b*c> d", "ünï", "a\x00b", "\xff", strings.Repeat("x", 201), "\u00a0x", "x\u2003", ".", "..", "reply_1", "error_1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if schema.ValidateID("conversation", id) != nil {
			return
		}
		n := utf8.RuneCountInString(id)
		if !utf8.ValidString(id) || n < 1 || n > schema.MaxIDLength {
			t.Fatalf("accepted %q: %d characters, valid UTF-8 %v", id, n, utf8.ValidString(id))
		}
		for _, r := range id {
			if unicode.IsControl(r) {
				t.Fatalf("accepted %q with control character %U", id, r)
			}
		}
		if strings.TrimSpace(id) != id {
			t.Fatalf("accepted %q with surrounding whitespace", id)
		}
		if id == "." || id == ".." {
			t.Fatalf("accepted %q, which a URL's path drops", id)
		}
		if schema.ValidateID("message", id) == nil && (strings.HasPrefix(id, "reply_") || strings.HasPrefix(id, "error_")) {
			t.Fatalf("accepted message id %q, a prefix of the server's messages", id)
		}
	})
}
