package natsconn_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/natsconn"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://baton:s3cret@n1:4222", "nats://redacted@n1:4222"},
		{"tls://t0ken@n1:4222", "tls://redacted@n1:4222"},
		{"baton:s3cret@n1:4222", "redacted@n1:4222"},
		{
			"nats://a:one@n1:4222, nats://b:two@n2:4222,nats://n3:4222",
			"nats://redacted@n1:4222, nats://redacted@n2:4222,nats://n3:4222",
		},
		// Does not parse as a URL: a space, a bare '%', an '@' in the
		// password; still nothing between "://" and the last '@' survives.
		{"nats://u:p ss%zz@@n1:4222", "nats://redacted@n1:4222"},
		{"nats://u:p@ss@n1:4222/x", "nats://redacted@n1:4222/x"},
		// An unencoded comma in a password.
		{"nats://u:pa,ss@n1:4222,nats://n2:4222", "nats://redacted@n1:4222,nats://n2:4222"},
		{"nats://u:a,b,c@n1", "nats://redacted@n1"},
		{"not a url at all", "not a url at all"},
	} {
		require.Equal(t, tc.want, natsconn.Redact(tc.in), "Redact(%q)", tc.in)
	}
}

// FuzzRedactRemovesTheSecret builds URL lists whose every element holds
// secret as its user information and checks that Redact's output is the
// list with "redacted" in its place: the secret, whatever it holds, is
// gone.
func FuzzRedactRemovesTheSecret(f *testing.F) {
	f.Add("nats", "user:password", "127.0.0.1:4222", uint8(1))
	f.Add("tls", "token", "n1.internal:4222", uint8(3))
	f.Add("nats", "a@b:c", "h", uint8(2))
	f.Add("ws", "u:p,q@r", "h:1", uint8(2))
	f.Add("nats", "u:%zz x", "h:1/x?y", uint8(1))
	f.Fuzz(func(t *testing.T, scheme, secret, host string, n uint8) {
		scheme = keep(scheme, func(r rune) bool { return r >= 'a' && r <= 'z' })
		if scheme == "" {
			scheme = "nats"
		}
		// A host never holds '@' or ','; neither does a scheme.
		host = keep(host, func(r rune) bool { return r != '@' && r != ',' })
		// A password that holds a comma followed by another "scheme://"
		// cannot be told from the next element of the list; NATS
		// clients cannot use such a password either.
		if strings.Contains(secret, ",") && strings.Contains(secret, "://") {
			t.Skip()
		}
		count := int(n%4) + 1
		in := make([]string, count)
		want := make([]string, count)
		for i := range count {
			in[i] = scheme + "://" + secret + "@" + host
			want[i] = scheme + "://redacted@" + host
		}
		got := natsconn.Redact(strings.Join(in, ","))
		if got != strings.Join(want, ",") {
			t.Fatalf("Redact(%q) = %q, want %q", strings.Join(in, ","), got, strings.Join(want, ","))
		}
	})
}

// FuzzRedactAnyString: on any input Redact does not panic, is idempotent,
// and leaves no '@' that is not preceded by "redacted".
func FuzzRedactAnyString(f *testing.F) {
	f.Add("nats://u:p@h:1,nats://h2")
	f.Add("@@,,://@")
	f.Add("a://b://c@d@e,f@g")
	f.Fuzz(func(t *testing.T, s string) {
		got := natsconn.Redact(s)
		if again := natsconn.Redact(got); again != got {
			t.Fatalf("Redact is not idempotent on %q: %q then %q", s, got, again)
		}
		for i := strings.Index(got, "@"); i >= 0; {
			if !strings.HasSuffix(got[:i], "redacted") {
				t.Fatalf("Redact(%q) = %q leaves text before the '@' at %d", s, got, i)
			}
			next := strings.Index(got[i+1:], "@")
			if next < 0 {
				break
			}
			i += next + 1
		}
	})
}

func keep(s string, ok func(rune) bool) string {
	return strings.Map(func(r rune) rune {
		if ok(r) {
			return r
		}
		return -1
	}, s)
}
