package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
