package relay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	batonnats "github.com/batonhq/baton/nats"
)

// The relay reads pgoutput protocol version 1. Its own parser, rather than
// pglogrepl.Parse, checks every length against the buffer: a truncated or
// corrupt message becomes an error that restarts the stream from the slot,
// never a panic that takes the relay down. Parsing is separate from I/O so
// it can be tested and fuzzed on raw bytes.

// ErrMalformed wraps every error about bytes that are not a valid pgoutput
// message.
var ErrMalformed = errors.New("relay: malformed pgoutput message")

// walMessage is one decoded pgoutput message.
type walMessage interface{ pgoutputType() byte }

type beginMessage struct {
	FinalLSN   pglogrepl.LSN
	CommitTime time.Time
	Xid        uint32
}

type commitMessage struct {
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN
	CommitTime time.Time
}

type relationMessage struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []string
}

// tupleValue is one column of a new row: nil Data with Null false means an
// unchanged TOASTed value, which an insert never carries.
type tupleValue struct {
	Null bool
	Data []byte
}

type insertMessage struct {
	RelationID uint32
	Values     []tupleValue
}

type logicalMessage struct {
	Transactional bool
	LSN           pglogrepl.LSN
	Prefix        string
	Content       []byte
}

// otherMessage is a message the relay does not act on (type, origin,
// truncate, update, delete).
type otherMessage struct{ Type byte }

func (beginMessage) pgoutputType() byte    { return 'B' }
func (commitMessage) pgoutputType() byte   { return 'C' }
func (relationMessage) pgoutputType() byte { return 'R' }
func (insertMessage) pgoutputType() byte   { return 'I' }
func (logicalMessage) pgoutputType() byte  { return 'M' }
func (m otherMessage) pgoutputType() byte  { return m.Type }

// reader reads big-endian fields and remembers the first short read.
type reader struct {
	buf []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.buf) {
		r.err = fmt.Errorf("%w: need %d bytes, have %d", ErrMalformed, n, len(r.buf))
		return nil
	}
	b := r.buf[:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) cstring() string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.buf {
		if c == 0 {
			s := string(r.buf[:i])
			r.buf = r.buf[i+1:]
			return s
		}
	}
	r.err = fmt.Errorf("%w: string without terminator", ErrMalformed)
	return ""
}

// pgEpoch is the origin of PostgreSQL timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (r *reader) timestamp() time.Time {
	us := int64(r.u64())
	return pgEpoch.Add(time.Duration(us) * time.Microsecond)
}

// parseWALMessage decodes the payload of one XLogData message.
func parseWALMessage(data []byte) (walMessage, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty message", ErrMalformed)
	}
	r := &reader{buf: data[1:]}
	var m walMessage
	switch data[0] {
	case 'B':
		m = beginMessage{FinalLSN: pglogrepl.LSN(r.u64()), CommitTime: r.timestamp(), Xid: r.u32()}
	case 'C':
		r.u8() // flags, unused
		m = commitMessage{CommitLSN: pglogrepl.LSN(r.u64()), EndLSN: pglogrepl.LSN(r.u64()), CommitTime: r.timestamp()}
	case 'R':
		rel := relationMessage{ID: r.u32(), Namespace: r.cstring(), Name: r.cstring()}
		r.u8() // replica identity
		n := int(r.u16())
		for i := 0; i < n && r.err == nil; i++ {
			r.u8() // flags
			rel.Columns = append(rel.Columns, r.cstring())
			r.u32() // type OID
			r.u32() // type modifier
		}
		m = rel
	case 'I':
		ins := insertMessage{RelationID: r.u32()}
		if kind := r.u8(); r.err == nil && kind != 'N' {
			return nil, fmt.Errorf("%w: insert tuple kind %q, want 'N'", ErrMalformed, kind)
		}
		ins.Values = r.tuple()
		m = ins
	case 'M':
		lm := logicalMessage{Transactional: r.u8()&1 == 1, LSN: pglogrepl.LSN(r.u64()), Prefix: r.cstring()}
		lm.Content = r.take(int(r.u32()))
		m = lm
	case 'Y', 'O', 'T', 'U', 'D':
		return otherMessage{Type: data[0]}, nil
	default:
		return nil, fmt.Errorf("%w: unknown message type %q (is the slot read with proto_version '1'?)", ErrMalformed, data[0])
	}
	if r.err != nil {
		return nil, fmt.Errorf("pgoutput %q message: %w", data[0], r.err)
	}
	return m, nil
}

func (r *reader) tuple() []tupleValue {
	n := int(r.u16())
	values := make([]tupleValue, 0, min(n, len(r.buf)))
	for i := 0; i < n && r.err == nil; i++ {
		switch kind := r.u8(); kind {
		case 'n':
			values = append(values, tupleValue{Null: true})
		case 'u':
			values = append(values, tupleValue{})
		case 't', 'b':
			values = append(values, tupleValue{Data: r.take(int(r.u32()))})
		default:
			if r.err == nil {
				r.err = fmt.Errorf("%w: column kind %q", ErrMalformed, kind)
			}
		}
	}
	return values
}

// parseID parses the text of a positive bigint, as strconv.ParseInt would;
// it returns 0 for anything else.
func parseID(b []byte) int64 {
	if len(b) == 0 || len(b) > 19 {
		return 0
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	if n > math.MaxInt64 {
		return 0
	}
	return int64(n)
}

// outboxColumns are the positions of the columns a trigger is made of.
type outboxColumns struct {
	id, conversationID, messageID, createdAt int
	// traceParent is -1 on a schema without the column.
	traceParent int
}

// outboxDecoder turns inserts into agent_outbox into triggers. pgoutput
// describes a table once per stream (and again after a schema change)
// before its first row, so the decoder keeps the relations it has seen.
type outboxDecoder struct {
	relations map[uint32]*outboxColumns // nil value: not the outbox
	types     *pgtype.Map
	// createdAt scans created_at; planned once rather than looked up in
	// types for every row.
	createdAt pgtype.ScanPlan
}

func newOutboxDecoder() *outboxDecoder {
	types := pgtype.NewMap()
	var t time.Time
	return &outboxDecoder{
		relations: map[uint32]*outboxColumns{},
		types:     types,
		createdAt: types.PlanScan(pgtype.TimestamptzOID, pgtype.TextFormatCode, &t),
	}
}

func (d *outboxDecoder) relation(m relationMessage) error {
	if m.Name != "agent_outbox" {
		d.relations[m.ID] = nil
		return nil
	}
	cols := outboxColumns{id: -1, conversationID: -1, messageID: -1, createdAt: -1, traceParent: -1}
	for i, name := range m.Columns {
		switch name {
		case "id":
			cols.id = i
		case "conversation_id":
			cols.conversationID = i
		case "message_id":
			cols.messageID = i
		case "created_at":
			cols.createdAt = i
		case "trace_parent":
			cols.traceParent = i
		}
	}
	if cols.id < 0 || cols.conversationID < 0 || cols.messageID < 0 || cols.createdAt < 0 {
		return fmt.Errorf("relation %s.%s lacks id, conversation_id, message_id or created_at: is the schema migrated?", m.Namespace, m.Name)
	}
	d.relations[m.ID] = &cols
	return nil
}

// trigger returns the trigger of an inserted outbox row; ok is false for
// rows of other tables.
func (d *outboxDecoder) trigger(m insertMessage) (t batonnats.Trigger, ok bool, err error) {
	cols, known := d.relations[m.RelationID]
	if !known {
		return t, false, fmt.Errorf("%w: insert into relation %d before its description", ErrMalformed, m.RelationID)
	}
	if cols == nil {
		return t, false, nil
	}
	value := func(i int, name string) ([]byte, error) {
		if i >= len(m.Values) || m.Values[i].Data == nil {
			return nil, fmt.Errorf("%w: outbox insert without %s", ErrMalformed, name)
		}
		return m.Values[i].Data, nil
	}
	id, err := value(cols.id, "id")
	if err != nil {
		return t, false, err
	}
	if t.OutboxID = parseID(id); t.OutboxID <= 0 {
		return t, false, fmt.Errorf("%w: outbox id %q", ErrMalformed, id)
	}
	conv, err := value(cols.conversationID, "conversation_id")
	if err != nil {
		return t, false, err
	}
	msg, err := value(cols.messageID, "message_id")
	if err != nil {
		return t, false, err
	}
	created, err := value(cols.createdAt, "created_at")
	if err != nil {
		return t, false, err
	}
	if err := d.createdAt.Scan(created, &t.CreatedAt); err != nil {
		return t, false, fmt.Errorf("%w: outbox created_at %q: %v", ErrMalformed, created, err)
	}
	// One allocation for both IDs.
	ids := string(conv) + string(msg)
	t.ConversationID, t.MessageID = ids[:len(conv)], ids[len(conv):]
	t.Reason = batonnats.ReasonInsert
	if i := cols.traceParent; i >= 0 && i < len(m.Values) && len(m.Values[i].Data) > 0 {
		t.TraceParent = string(m.Values[i].Data)
	}
	return t, true, nil
}
