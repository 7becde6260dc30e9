package nats_test

import (
	"context"
	"fmt"
	"maps"
	"net/textproto"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/docs/events"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// requireHeaderValue checks what every NATS client needs of a header
// value: printable ASCII (space included), nothing a client trims at
// either end.
func requireHeaderValue(t testing.TB, v string) {
	t.Helper()
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] > '~' {
			t.Fatalf("header value %q has byte 0x%02x at %d: want printable ASCII", v, v[i], i)
		}
	}
	if strings.TrimFunc(v, unicode.IsSpace) != v || textproto.TrimString(v) != v {
		t.Fatalf("header value %q has whitespace at an end, which clients trim", v)
	}
}

func TestEncodeHeaderValueLeavesServerChosenIDsAsTheyAre(t *testing.T) {
	t.Parallel()
	for _, id := range []string{
		"", "c_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6a", "m_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6b", "run_0192f5a0", "outbox-12-a3",
		"inner spaces stay", "a.b*c>d", `!"#$&'()*+,-./:;<=>?@[\]^_{|}~`,
	} {
		require.True(t, batonnats.HeaderValueSafe(id), "%q needs no encoding", id)
		require.Equal(t, id, batonnats.EncodeHeaderValue(id))
		back, err := batonnats.DecodeHeaderValue(id)
		require.NoError(t, err)
		require.Equal(t, id, back)
	}
}

func TestEncodeHeaderValueEscapesWhatClientsWouldChange(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		" ":                "%20",
		"  ":               "%20%20",
		"   ":              "%20 %20",
		" lead":            "%20lead",
		"trail ":           "trail%20",
		" both ends ":      "%20both ends%20",
		"100%":             "100%25",
		"%41":              "%2541",
		"über":             "%C3%BCber",
		"会話":               "%E4%BC%9A%E8%A9%B1",
		"tab\tnl\ncr\r":    "tab%09nl%0Acr%0D",
		"nul\x00del\x7f":   "nul%00del%7F",
		"bad\xff\xfe":      "bad%FF%FE",
		"\u00a0nbsp\u00a0": "%C2%A0nbsp%C2%A0",
	} {
		require.False(t, batonnats.HeaderValueSafe(id), "%q needs encoding", id)
		got := batonnats.EncodeHeaderValue(id)
		require.Equal(t, want, got, "encoding of %q", id)
		require.Equal(t, "x:"+want, string(batonnats.AppendHeaderValue([]byte("x:"), id)))
		requireHeaderValue(t, got)
		back, err := batonnats.DecodeHeaderValue(got)
		require.NoError(t, err)
		require.Equal(t, id, back)
	}
}

func TestDecodeHeaderValueReadsAnyPercentEncodingAndRefusesRawText(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]string{
		"%c3%bcber": "über", // lowercase hex, as other encoders write it
		"%61%62":    "ab",   // escapes of bytes that need none
		"a b":       "a b",
	} {
		got, err := batonnats.DecodeHeaderValue(v)
		require.NoError(t, err)
		require.Equal(t, want, got, "decoding of %q", v)
	}
	for _, v := range []string{"100%", "%4", "%zz", "%%41", "über", "tab\there", "nl\n", "\x7f", "a%"} {
		_, err := batonnats.DecodeHeaderValue(v)
		require.ErrorIs(t, err, batonnats.ErrHeaderValue, "%q is not an encoded id", v)
	}
}

func FuzzHeaderValueRoundTrip(f *testing.F) {
	for _, s := range []string{"", " ", "c_0192", "a b", " x ", "%", "%25", "über", "\x00", "\xff", "\t\n", "\u00a0", "\u2028", "a.b*c>d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		v := batonnats.EncodeHeaderValue(id)
		requireHeaderValue(t, v)
		back, err := batonnats.DecodeHeaderValue(v)
		if err != nil || back != id {
			t.Fatalf("%q encodes to %q, which decodes to %q, %v", id, v, back, err)
		}
		if safe := batonnats.HeaderValueSafe(id); safe != (v == id) {
			t.Fatalf("HeaderValueSafe(%q) = %v, but it encodes to %q", id, safe, v)
		}
		if got := string(batonnats.AppendHeaderValue([]byte("p"), id)); got != "p"+v {
			t.Fatalf("AppendHeaderValue of %q appends %q, EncodeHeaderValue gives %q", id, got[1:], v)
		}
		// A value that decodes is printable ASCII, and its decoding
		// encodes back to one that decodes to the same id.
		if d, err := batonnats.DecodeHeaderValue(id); err == nil {
			again, err := batonnats.DecodeHeaderValue(batonnats.EncodeHeaderValue(d))
			if err != nil || again != d {
				t.Fatalf("%q decodes to %q, which does not round-trip: %q, %v", id, d, again, err)
			}
		}
	})
}

// awkwardIDs hold everything a conversation or message key created before
// keys were server-chosen may hold.
var awkwardIDs = []string{
	"Ünïcödé 会話 🙂",
	" leading and trailing spaces ",
	"inner  spaces",
	"dots.in.it",
	"star*",
	"greater>than",
	" .*> \u00a0mixed\u3000 ",
	"100% sure",
	"\ttabs and\nnewlines\r\n",
}

// A trigger published through a real NATS server and read back with the
// nats.go client: every header is ASCII, no client can trim it, and the ids
// decode back exactly.
func TestTriggerHeadersCrossNATSAsASCIIAndDecodeToTheExactIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, js := testenv.StartNATS(t).Connect(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HEADERS", Subjects: []string{"hdr.>"}})
	require.NoError(t, err)
	sub, err := nc.SubscribeSync("hdr.>")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	var sent []batonnats.Trigger
	for i, cid := range awkwardIDs {
		tr := batonnats.Trigger{
			OutboxID: int64(i + 1), ConversationID: cid, MessageID: awkwardIDs[len(awkwardIDs)-1-i],
			CreatedAt: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), Reason: batonnats.ReasonInsert,
		}
		m, err := tr.Msg("hdr", 16)
		require.NoError(t, err)
		_, err = js.PublishMsg(ctx, m)
		require.NoError(t, err)
		sent = append(sent, tr)
	}

	cons, err := js.OrderedConsumer(ctx, "HEADERS", jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for _, want := range sent {
		// What the stream stored, and what a plain subscriber received.
		stored, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		live, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err)
		require.Equal(t, map[string][]string(stored.Headers()), map[string][]string(live.Header))
		for name, values := range live.Header {
			require.Len(t, values, 1, "header %s", name)
			requireHeaderValue(t, values[0])
		}
		for name, id := range map[string]string{batonnats.HeaderConversationID: want.ConversationID, batonnats.HeaderMessageID: want.MessageID} {
			back, err := batonnats.DecodeHeaderValue(live.Header.Get(name))
			require.NoError(t, err)
			require.Equal(t, id, back, "%s decodes to the exact id", name)
		}
		got, err := batonnats.TriggerOfHeader(live.Header)
		require.NoError(t, err)
		want.CreatedAt = time.Time{} // only the body carries it
		require.Equal(t, want, got)
		body, err := batonnats.ParseTrigger(live.Data)
		require.NoError(t, err)
		require.Equal(t, want.ConversationID, body.ConversationID, "the body holds the id as it is")
		require.NoError(t, events.ValidateHeader(events.KindTrigger, live.Header))
	}
}

func TestTriggerOfHeaderReadsAnnouncementsAndRefusesForeignHeaders(t *testing.T) {
	t.Parallel()
	tr := batonnats.Trigger{OutboxID: 15, ConversationID: " c ", MessageID: "m", Reason: batonnats.ReasonRetry, Announcement: "a2"}
	m, err := tr.Msg("p", 1)
	require.NoError(t, err)
	got, err := batonnats.TriggerOfHeader(m.Header)
	require.NoError(t, err)
	require.Equal(t, tr, got)

	for name, value := range map[string]string{
		batonnats.HeaderOutboxID:       "x",
		batonnats.HeaderConversationID: "",
		batonnats.HeaderMessageID:      "100%",
	} {
		h := maps.Clone(m.Header)
		h.Set(name, value)
		_, err := batonnats.TriggerOfHeader(h)
		require.Error(t, err, "%s: %q must be refused", name, value)
	}
}

func BenchmarkHeaderValue(b *testing.B) {
	for _, bc := range []struct{ name, id string }{
		{"safe", "c_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6a"},
		{"unicode", " Ünïcödé 会話 a.b*c>d "},
	} {
		b.Run(bc.name+"/check", func(b *testing.B) {
			for b.Loop() {
				batonnats.HeaderValueSafe(bc.id)
			}
		})
		b.Run(bc.name+"/append", func(b *testing.B) {
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				buf = batonnats.AppendHeaderValue(buf[:0], bc.id)
			}
		})
	}
}

func ExampleEncodeHeaderValue() {
	for _, id := range []string{"c_0192f5a0", " über 100%", "über "} {
		v := batonnats.EncodeHeaderValue(id)
		back, _ := batonnats.DecodeHeaderValue(v)
		fmt.Printf("%q -> %q -> %q\n", id, v, back)
	}
	// Output:
	// "c_0192f5a0" -> "c_0192f5a0" -> "c_0192f5a0"
	// " über 100%" -> "%20%C3%BCber 100%25" -> " über 100%"
	// "über " -> "%C3%BCber%20" -> "über "
}
