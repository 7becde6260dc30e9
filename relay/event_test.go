package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/docs/events"
	batonnats "github.com/batonhq/baton/nats"
)

// requireSameMsg checks that eventMsg builds what batonnats.Trigger.Msg
// builds, and that the body decodes back to t.
func requireSameMsg(t testing.TB, e *eventBuilder, tr batonnats.Trigger) {
	t.Helper()
	want, wantErr := tr.Msg(e.prefix, e.partitions)
	got, err := e.build(&tr)
	if wantErr != nil {
		require.Error(t, err, "Trigger.Msg failed with %v", wantErr)
		return
	}
	require.NoError(t, err)
	require.Equal(t, want.Subject, got.Subject)
	require.Equal(t, want.Header, got.Header)
	require.Equal(t, string(want.Data), string(got.Data))
	// Ids cross NATS as printable ASCII that no client trims, and decode
	// back to the exact ids.
	for name, id := range map[string]string{batonnats.HeaderConversationID: tr.ConversationID, batonnats.HeaderMessageID: tr.MessageID} {
		v := got.Header.Get(name)
		for i := 0; i < len(v); i++ {
			require.True(t, v[i] >= ' ' && v[i] <= '~', "%s %q has byte 0x%02x: want printable ASCII", name, v, v[i])
		}
		require.Equal(t, strings.TrimSpace(v), v, "%s %q has a space at an end", name, v)
		back, err := batonnats.DecodeHeaderValue(v)
		require.NoError(t, err)
		require.Equal(t, id, back, "%s decodes to the exact id", name)
	}
	if tr.OutboxID > 0 && tr.ConversationID != "" {
		back, err := batonnats.ParseTrigger(got.Data)
		require.NoError(t, err)
		want, err := batonnats.ParseTrigger(want.Data)
		require.NoError(t, err)
		require.Equal(t, want, back)
	}
}

func TestEventMsgMatchesTriggerMsg(t *testing.T) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	cases := []batonnats.Trigger{
		{OutboxID: 1, ConversationID: "c", MessageID: "m", CreatedAt: created, Reason: batonnats.ReasonInsert},
		{OutboxID: 9223372036854775807, ConversationID: "conv.with*odd>chars and spaces", MessageID: "m-1", CreatedAt: created.In(time.FixedZone("x", 5*3600+1800)), Reason: batonnats.ReasonRetry, Announcement: "a3"},
		{OutboxID: 42, ConversationID: "Ünïcödé 会話 🙂", MessageID: "<script>&\"quoted\"\\", CreatedAt: time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC), Reason: batonnats.ReasonSweep, Announcement: "s1700000000000000000"},
		{OutboxID: 7, ConversationID: "ctl\x00\x01\x1f\b\f\n\r\t\x7f", MessageID: "bad utf8 \xff\xfe \xe2\x28\xa1", CreatedAt: created, Reason: batonnats.ReasonInsert},
		{OutboxID: 8, ConversationID: "line\u2028sep\u2029", MessageID: "", CreatedAt: time.Time{}, Reason: ""},
		{OutboxID: 10, ConversationID: " padded \u00a0", MessageID: "%41 100% ", CreatedAt: created, Reason: batonnats.ReasonUserRetry, Announcement: "u1"},
		// RFC 3339 cannot hold year 10000: both must fail.
		{OutboxID: 9, ConversationID: "c", MessageID: "m", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Reason: batonnats.ReasonInsert},
	}
	// One builder per setting, reused across triggers as the relay does.
	for _, partitions := range []int{0, 1, 16, 7} {
		e := newEventBuilder("baton.outbox", partitions)
		for range 2 {
			for _, tr := range cases {
				requireSameMsg(t, e, tr)
				requireSameMsg(t, newEventBuilder("baton.outbox", partitions), tr)
			}
		}
	}
}

// Every message the relay builds for a trigger Baton writes matches the
// published event format, whatever its ids hold.
func TestEventMsgMatchesTheEventSchema(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	ids := []string{
		"c_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6a",
		"conv.with*odd>chars and spaces",
		" leading and trailing ",
		"Ünïcödé 会話 🙂",
		"<script>&\"quoted\"\\",
		"ctl\x01\x1f\b\f\n\r\t\x7f",
		"bad utf8 \xff\xfe \xe2\x28\xa1",
		"line\u2028sep\u2029",
		"100%25 %",
		strings.Repeat("会", 200),
	}
	reasons := []struct {
		reason       batonnats.Reason
		announcement string
	}{
		{batonnats.ReasonInsert, ""},
		{batonnats.ReasonRetry, "a3"},
		{batonnats.ReasonSweep, "s1700000000000000000"},
		{batonnats.ReasonUserRetry, "u1700000000000000001"},
	}
	for _, partitions := range []int{1, 16} {
		e := newEventBuilder(batonnats.DefaultSubjectPrefix, partitions)
		for i, id := range ids {
			for j, r := range reasons {
				tr := batonnats.Trigger{
					OutboxID: int64(1 + i*len(reasons) + j), ConversationID: id, MessageID: ids[len(ids)-1-i],
					CreatedAt: created.In(time.FixedZone("x", j*-5400)), Reason: r.reason, Announcement: r.announcement,
				}
				m, err := e.build(&tr)
				require.NoError(t, err)
				require.NoError(t, events.ValidateMessage(events.KindTrigger, m.Subject, m.Header, m.Data))
			}
		}
	}
}

func FuzzEventMsg(f *testing.F) {
	e := newEventBuilder("baton.outbox", 16)
	f.Add(int64(1), "conv", "msg", int64(0), "insert", "")
	f.Add(int64(123456), "a.b*c>d e", "<&>", int64(1700000000123456789), "retry", "a2")
	f.Add(int64(5), "\xff\u2028é", "\x00\t", int64(-1), "sweep", "s1")
	f.Fuzz(func(t *testing.T, id int64, conv, msg string, nanos int64, reason, announcement string) {
		tr := batonnats.Trigger{
			OutboxID:       id,
			ConversationID: conv,
			MessageID:      msg,
			CreatedAt:      time.Unix(0, nanos).UTC(),
			Reason:         batonnats.Reason(reason),
			Announcement:   announcement,
		}
		requireSameMsg(t, e, tr)
	})
}

// BenchmarkEventBuild measures the relay's cost per outbox row: one build
// of a trigger's message. "ascii" is a conversation of today (server-chosen
// keys); "legacy" one whose client-chosen keys need encoding in headers.
func BenchmarkEventBuild(b *testing.B) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011000, time.UTC)
	for _, bc := range []struct {
		name string
		tr   batonnats.Trigger
	}{
		{"ascii", batonnats.Trigger{OutboxID: 123456, ConversationID: "c_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6a", MessageID: "m_0192f5a0-7c1e-7d3b-9a51-3c2f1e0d4b6b", CreatedAt: created, Reason: batonnats.ReasonInsert}},
		{"legacy", batonnats.Trigger{OutboxID: 123456, ConversationID: " Ünïcödé 会話 a.b*c>d ", MessageID: "message 1 🙂", CreatedAt: created, Reason: batonnats.ReasonRetry, Announcement: "a2"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEventBuilder("baton.outbox", 16)
			tr := bc.tr
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.build(&tr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
