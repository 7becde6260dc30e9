package nats

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// isSubjectToken reports whether tok is one NATS subject token: non-empty,
// without separators, wildcards or whitespace.
func isSubjectToken(tok string) bool {
	return tok != "" && !strings.ContainsAny(tok, ".*> \t\r\n\f\v")
}

func TestTokenRoundTripsAwkwardConversationIDs(t *testing.T) {
	t.Parallel()
	for _, id := range []string{
		"plain", "a.b.c", "*", ">", "a b", " leading", "trailing ", "über-ß", "日本語の会話", "emoji 🎉",
		"..", "*.>", "tab\there", "conv.%d *> über", strings.Repeat("x", 200),
	} {
		tok := EncodeToken(id)
		require.True(t, isSubjectToken(tok), "token %q of %q is not one subject token", tok, id)
		back, err := DecodeToken(tok)
		require.NoError(t, err)
		require.Equal(t, id, back)

		subject := Subject(DefaultSubjectPrefix, DefaultPartitions, id)
		p, conv, err := ParseSubject(DefaultSubjectPrefix, subject)
		require.NoError(t, err)
		require.Equal(t, id, conv)
		require.Equal(t, Partition(id, DefaultPartitions), p)
		require.Len(t, strings.Split(subject, "."), 4, "subject %q is <prefix>.<partition>.<token>", subject)
	}
}

func TestParseSubjectRejectsForeignSubjects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"other.1.YQ", "baton.outbox.1", "baton.outbox.x.YQ", "baton.outbox.-1.YQ", "baton.outbox.1.YQ.extra", "baton.outbox.1.!!"} {
		_, _, err := ParseSubject(DefaultSubjectPrefix, s)
		require.Error(t, err, "subject %q", s)
	}
}

func FuzzToken(f *testing.F) {
	for _, s := range []string{"a", "a.b", "*", ">", " ", "über", "日本", "\x00", "a\xffb"} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, id string, partitions int) {
		if id == "" {
			return // conversation IDs are never empty
		}
		tok := EncodeToken(id)
		if !isSubjectToken(tok) {
			t.Fatalf("token %q of %q is not one subject token", tok, id)
		}
		back, err := DecodeToken(tok)
		if err != nil || back != id {
			t.Fatalf("token %q of %q decodes to %q, %v", tok, id, back, err)
		}
		p := Partition(id, partitions)
		if partitions > 1 && (p < 0 || p >= partitions) || partitions <= 1 && p != 0 {
			t.Fatalf("partition %d of %d", p, partitions)
		}
		if partitions < 1 || partitions > 4096 {
			return
		}
		gotP, gotID, err := ParseSubject(DefaultSubjectPrefix, Subject(DefaultSubjectPrefix, partitions, id))
		if err != nil || gotID != id || gotP != p {
			t.Fatalf("subject of %q parses to %d %q %v", id, gotP, gotID, err)
		}
		if utf8.ValidString(id) && Partition(id, partitions) != p {
			t.Fatal("partition is not stable")
		}
	})
}
