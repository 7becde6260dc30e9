package relay

import (
	"encoding/binary"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// pgoutput encoders, the inverse of parseWALMessage, for tests.

func u16(b []byte, v uint16) []byte  { return binary.BigEndian.AppendUint16(b, v) }
func u32(b []byte, v uint32) []byte  { return binary.BigEndian.AppendUint32(b, v) }
func u64(b []byte, v uint64) []byte  { return binary.BigEndian.AppendUint64(b, v) }
func cstr(b []byte, s string) []byte { return append(append(b, s...), 0) }

func pgTime(t time.Time) uint64 { return uint64(t.Sub(pgEpoch) / time.Microsecond) }

func encodeBegin(final pglogrepl.LSN, commit time.Time, xid uint32) []byte {
	return u32(u64(u64([]byte{'B'}, uint64(final)), pgTime(commit)), xid)
}

func encodeCommit(commitLSN, end pglogrepl.LSN, commit time.Time) []byte {
	return u64(u64(u64([]byte{'C', 0}, uint64(commitLSN)), uint64(end)), pgTime(commit))
}

func encodeRelation(id uint32, ns, name string, cols ...string) []byte {
	b := cstr(cstr(u32([]byte{'R'}, id), ns), name)
	b = u16(append(b, 'd'), uint16(len(cols)))
	for _, c := range cols {
		b = u32(u32(cstr(append(b, 0), c), 25), 0xffffffff)
	}
	return b
}

// encodeInsert takes column values; nil is NULL.
func encodeInsert(rel uint32, values ...*string) []byte {
	b := u16(append(u32([]byte{'I'}, rel), 'N'), uint16(len(values)))
	for _, v := range values {
		if v == nil {
			b = append(b, 'n')
			continue
		}
		b = append(u32(append(b, 't'), uint32(len(*v))), *v...)
	}
	return b
}

func encodeLogical(transactional bool, lsn pglogrepl.LSN, prefix string, content []byte) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	b := cstr(u64([]byte{'M', flags}, uint64(lsn)), prefix)
	return append(u32(b, uint32(len(content))), content...)
}

func str(s string) *string { return &s }

var outboxRelation = encodeRelation(16400, "public", "agent_outbox",
	"id", "conversation_id", "message_id", "status", "attempts", "created_at", "processed_at", "run_id", "announced_at")

func outboxInsert(id, conv, msg, created string) []byte {
	return encodeInsert(16400, str(id), str(conv), str(msg), str("pending"), str("0"), str(created), nil, nil, nil)
}

func TestParseWALMessageRoundTrips(t *testing.T) {
	t.Parallel()
	commit := time.Date(2026, 3, 4, 5, 6, 7, 123456000, time.UTC)
	m, err := parseWALMessage(encodeBegin(0x1_0000_0010, commit, 77))
	require.NoError(t, err)
	require.Equal(t, beginMessage{FinalLSN: 0x1_0000_0010, CommitTime: commit, Xid: 77}, m)

	m, err = parseWALMessage(encodeCommit(0x20, 0x48, commit))
	require.NoError(t, err)
	require.Equal(t, commitMessage{CommitLSN: 0x20, EndLSN: 0x48, CommitTime: commit}, m)

	m, err = parseWALMessage(outboxRelation)
	require.NoError(t, err)
	require.Equal(t, "agent_outbox", m.(relationMessage).Name)
	require.Len(t, m.(relationMessage).Columns, 9)

	m, err = parseWALMessage(encodeLogical(true, 0x99, schema.AnnouncePrefix, []byte(`{"reason":"sweep"}`)))
	require.NoError(t, err)
	require.Equal(t, logicalMessage{Transactional: true, LSN: 0x99, Prefix: schema.AnnouncePrefix, Content: []byte(`{"reason":"sweep"}`)}, m)

	m, err = parseWALMessage([]byte{'Y', 1, 2, 3})
	require.NoError(t, err)
	require.Equal(t, otherMessage{Type: 'Y'}, m)
}

func TestParseWALMessageRejectsTruncatedInput(t *testing.T) {
	t.Parallel()
	full := outboxInsert("42", "a.b", "m", "2026-01-02 03:04:05.678+00")
	for n := 0; n < len(full); n++ {
		_, err := parseWALMessage(full[:n])
		require.ErrorIs(t, err, ErrMalformed, "an insert cut to %d of %d bytes", n, len(full))
	}
	_, err := parseWALMessage([]byte{'Z'})
	require.ErrorIs(t, err, ErrMalformed, "unknown message types are errors")
}

func TestOutboxDecoderMakesTriggers(t *testing.T) {
	t.Parallel()
	d := newOutboxDecoder()
	rel, err := parseWALMessage(outboxRelation)
	require.NoError(t, err)
	require.NoError(t, d.relation(rel.(relationMessage)))

	ins, err := parseWALMessage(outboxInsert("42", "conv. *> über", "msg-1", "2026-01-02 03:04:05.678+01"))
	require.NoError(t, err)
	tr, ok, err := d.trigger(ins.(insertMessage))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(42), tr.OutboxID)
	require.Equal(t, "conv. *> über", tr.ConversationID)
	require.Equal(t, "msg-1", tr.MessageID)
	require.Equal(t, batonnats.ReasonInsert, tr.Reason)
	require.True(t, tr.CreatedAt.Equal(time.Date(2026, 1, 2, 2, 4, 5, 678000000, time.UTC)), "created_at %s", tr.CreatedAt)
	require.Equal(t, "outbox-42", tr.MsgID())

	// Rows of other tables are not events.
	other, err := parseWALMessage(encodeRelation(7, "public", "busy", "id"))
	require.NoError(t, err)
	require.NoError(t, d.relation(other.(relationMessage)))
	_, ok, err = d.trigger(insertMessage{RelationID: 7, Values: []tupleValue{{Data: []byte("1")}}})
	require.NoError(t, err)
	require.False(t, ok)

	// A row of a relation never described is a protocol error.
	_, _, err = d.trigger(insertMessage{RelationID: 8})
	require.ErrorIs(t, err, ErrMalformed)
	// So is an outbox row without its id.
	bad, err := parseWALMessage(encodeInsert(16400, nil, str("c"), str("m"), nil, nil, str("2026-01-02 03:04:05+00")))
	require.NoError(t, err)
	_, _, err = d.trigger(bad.(insertMessage))
	require.ErrorIs(t, err, ErrMalformed)
}

// FuzzDecodeWAL feeds arbitrary bytes through the relay's decoding of
// replication messages: it must return errors, never panic, and decode
// what it accepts consistently.
func FuzzDecodeWAL(f *testing.F) {
	commit := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	announce, _ := json.Marshal(schema.Announcement{Reason: batonnats.ReasonSweep, Triggers: []batonnats.Trigger{{OutboxID: 1, ConversationID: "c"}}})
	for _, seed := range [][]byte{
		encodeBegin(0x10, commit, 1),
		encodeCommit(0x10, 0x18, commit),
		outboxRelation,
		outboxInsert("1", "c.*> ü", "m", "2026-01-02 03:04:05+00"),
		outboxInsert("-1", "", "", "infinity"),
		encodeLogical(true, 0x20, schema.AnnouncePrefix, announce),
		encodeLogical(false, 0x20, schema.HeartbeatPrefix, []byte("2026")),
		{'Y'}, {},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := newOutboxDecoder()
		_ = d.relation(relationMessage{ID: 16400, Name: "agent_outbox", Columns: []string{"id", "conversation_id", "message_id", "status", "attempts", "created_at"}})
		m, err := parseWALMessage(data)
		if err != nil {
			return
		}
		switch m := m.(type) {
		case relationMessage:
			_ = d.relation(m)
		case insertMessage:
			tr, ok, err := d.trigger(m)
			if err == nil && ok {
				if tr.OutboxID <= 0 || tr.Reason != batonnats.ReasonInsert {
					t.Fatalf("accepted trigger %+v", tr)
				}
				if _, err := tr.Msg(batonnats.DefaultSubjectPrefix, batonnats.DefaultPartitions); err != nil {
					t.Fatalf("trigger %+v makes no message: %v", tr, err)
				}
			}
		case logicalMessage:
			if m.Prefix == schema.AnnouncePrefix {
				_, _ = schema.ParseAnnouncement(m.Content)
			}
			again, err := parseWALMessage(encodeLogical(m.Transactional, m.LSN, m.Prefix, m.Content))
			if err != nil || again.(logicalMessage).Prefix != m.Prefix || string(again.(logicalMessage).Content) != string(m.Content) {
				t.Fatalf("logical message %+v does not round-trip: %+v, %v", m, again, err)
			}
		}
	})
}

func TestParseIDAgreesWithParseInt(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"", "0", "1", "42", "007", "-1", "+1", "1a", " 1", "9223372036854775807",
		"9223372036854775808", "18446744073709551615", "99999999999999999999", "12345678901234567890",
	} {
		want, err := strconv.ParseInt(s, 10, 64)
		if err != nil || want <= 0 || s[0] == '+' {
			// PostgreSQL never writes a sign before a bigint.
			want = 0
		}
		require.Equal(t, want, parseID([]byte(s)), "parseID(%q)", s)
	}
}
