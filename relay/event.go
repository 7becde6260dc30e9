package relay

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	natsclient "github.com/nats-io/nats.go"

	batonnats "github.com/batonhq/baton/nats"
)

// eventBuilder builds the JetStream messages of triggers: the same
// subject, headers and body as batonnats.Trigger.Msg, byte for byte, without
// reflection and reusing one message, header map and body buffer. The relay
// builds one message per outbox row, so the cost counts;
// TestEventMsgMatchesTriggerMsg keeps the two in step.
//
// The message build returns is valid until the next build: the NATS client
// copies what it publishes before PublishMsg returns.
type eventBuilder struct {
	prefix     string
	partitions int
	msg        natsclient.Msg
	values     []string // the header values, one per header
	body       []byte
	scratch    []byte
}

func newEventBuilder(prefix string, partitions int) *eventBuilder {
	values := make([]string, 5)
	return &eventBuilder{
		prefix:     prefix,
		partitions: partitions,
		values:     values,
		msg: natsclient.Msg{Header: natsclient.Header{
			batonnats.HeaderMsgID:          values[0:1:1],
			batonnats.HeaderOutboxID:       values[1:2:2],
			batonnats.HeaderConversationID: values[2:3:3],
			batonnats.HeaderMessageID:      values[3:4:4],
			batonnats.HeaderReason:         values[4:5:5],
		}},
	}
}

// eventMsg builds the message of t in memory of its own.
func eventMsg(t *batonnats.Trigger, prefix string, partitions int) (*natsclient.Msg, error) {
	return newEventBuilder(prefix, partitions).build(t)
}

func (e *eventBuilder) build(t *batonnats.Trigger) (*natsclient.Msg, error) {
	body, err := appendTrigger(e.body[:0], t)
	if err != nil {
		return nil, err
	}
	e.body = body

	// The subject, "outbox-<id>[-<announcement>]" and the encoded ids share
	// one string; the outbox ID header is a part of the second.
	enc := base64.RawURLEncoding
	b := e.scratch[:0]
	b = append(b, e.prefix...)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(batonnats.Partition(t.ConversationID, e.partitions)), 10)
	b = append(b, '.')
	b = enc.AppendEncode(b, []byte(t.ConversationID))
	subjectEnd := len(b)
	b = append(b, "outbox-"...)
	b = strconv.AppendInt(b, t.OutboxID, 10)
	idEnd := len(b)
	if t.Announcement != "" {
		b = append(b, '-')
		b = append(b, t.Announcement...)
	}
	// Ids that need encoding (those of conversations older than
	// server-chosen keys) are appended too; the others are used as they
	// are, without a copy.
	msgIDEnd := len(b)
	conversationSafe := batonnats.HeaderValueSafe(t.ConversationID)
	if !conversationSafe {
		b = batonnats.AppendHeaderValue(b, t.ConversationID)
	}
	conversationEnd := len(b)
	messageSafe := batonnats.HeaderValueSafe(t.MessageID)
	if !messageSafe {
		b = batonnats.AppendHeaderValue(b, t.MessageID)
	}
	e.scratch = b
	s := string(b)

	e.values[0] = s[subjectEnd:msgIDEnd]
	e.values[1] = s[subjectEnd+len("outbox-") : idEnd]
	e.values[2] = t.ConversationID
	if !conversationSafe {
		e.values[2] = s[msgIDEnd:conversationEnd]
	}
	e.values[3] = t.MessageID
	if !messageSafe {
		e.values[3] = s[conversationEnd:]
	}
	e.values[4] = string(t.Reason)
	if t.TraceParent != "" {
		e.msg.Header[batonnats.HeaderTraceParent] = []string{t.TraceParent}
	} else {
		delete(e.msg.Header, batonnats.HeaderTraceParent)
	}
	e.msg.Subject = s[:subjectEnd]
	e.msg.Reply = ""
	e.msg.Data = e.body
	return &e.msg, nil
}

// appendTrigger appends the JSON encoding of t, as encoding/json writes it.
func appendTrigger(b []byte, t *batonnats.Trigger) ([]byte, error) {
	b = append(b, `{"outbox_id":`...)
	b = strconv.AppendInt(b, t.OutboxID, 10)
	b = append(b, `,"conversation_id":`...)
	b = appendJSONString(b, t.ConversationID)
	b = append(b, `,"message_id":`...)
	b = appendJSONString(b, t.MessageID)
	b = append(b, `,"created_at":"`...)
	// time.Time.MarshalJSON is AppendText between quotes, with the same
	// error for a time RFC 3339 cannot represent.
	b, err := t.CreatedAt.AppendText(b)
	if err != nil {
		return nil, err
	}
	b = append(b, `","reason":`...)
	b = appendJSONString(b, string(t.Reason))
	if t.Announcement != "" {
		b = append(b, `,"announcement":`...)
		b = appendJSONString(b, t.Announcement)
	}
	return append(b, '}'), nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json does
// by default: HTML-safe, with invalid UTF-8 replaced by U+FFFD and U+2028
// and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
