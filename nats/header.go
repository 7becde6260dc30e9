package nats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	natsclient "github.com/nats-io/nats.go"
)

// Header values that carry an id (Baton-Conversation-Id, Baton-Message-Id,
// and a Nats-Msg-Id built from one) are encoded so that every NATS client
// reads back exactly what the database holds. Ids of conversations and
// messages that predate server-chosen keys are whatever a client chose:
// any Unicode, control characters, spaces at either end. Sent raw, they
// break twice: NATS header values are ASCII, and clients trim whitespace
// at the ends of a value (nats.go when it writes one, others, Unicode
// whitespace included, when they read one).
//
// The encoding is percent-encoding with uppercase hex digits of every byte
// outside the printable ASCII range '!' to '~', of '%' itself, and of a
// space at the start or end of the value. An inner space, and every other
// printable ASCII byte, stays as it is. So a server-chosen id (c_<uuid>,
// m_<uuid>, run_<uuid>) is sent unchanged, any other id comes out as
// printable ASCII without whitespace at either end, and decoding gives back
// the exact bytes, invalid UTF-8 included. Any percent-decoder that does
// not turn '+' into a space reads it (JavaScript's decodeURIComponent when
// the id is valid UTF-8, Python's urllib.parse.unquote_to_bytes).

// ErrHeaderValue is returned, wrapped, for a header value that is not an
// encoded id.
var ErrHeaderValue = errors.New("nats: header value is not an encoded id")

const upperHex = "0123456789ABCDEF"

// innerKeeps tells the bytes that are written as they are inside a value;
// at either end, a space is escaped too.
var innerKeeps = func() (t [256]bool) {
	for c := ' '; c <= '~'; c++ {
		t[c] = c != '%'
	}
	return t
}()

// headerKeeps reports whether byte c at index i of a value of length n is
// written as it is.
func headerKeeps(c byte, i, n int) bool {
	return innerKeeps[c] && (c != ' ' || (i != 0 && i != n-1))
}

// HeaderValueSafe reports whether id goes into a header as it is, that is
// whether EncodeHeaderValue(id) == id. Every server-chosen id is safe.
func HeaderValueSafe(id string) bool {
	if id != "" && (id[0] == ' ' || id[len(id)-1] == ' ') {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !innerKeeps[id[i]] {
			return false
		}
	}
	return true
}

// EncodeHeaderValue returns id as a header value: printable ASCII, without
// whitespace at either end, decoding back to id with DecodeHeaderValue. An
// id that needs no encoding is returned as it is.
func EncodeHeaderValue(id string) string {
	if HeaderValueSafe(id) {
		return id
	}
	return string(AppendHeaderValue(make([]byte, 0, 3*len(id)), id))
}

// AppendHeaderValue appends EncodeHeaderValue(id) to b, for builders that
// reuse a buffer.
func AppendHeaderValue(b []byte, id string) []byte {
	start := 0
	for i := 0; i < len(id); i++ {
		if c := id[i]; !headerKeeps(c, i, len(id)) {
			b = append(b, id[start:i]...)
			b = append(b, '%', upperHex[c>>4], upperHex[c&0xf])
			start = i + 1
		}
	}
	return append(b, id[start:]...)
}

// DecodeHeaderValue reverses EncodeHeaderValue. It accepts lowercase hex
// digits and escapes of bytes that need none, as any percent-encoder may
// write them, and refuses a value holding a byte outside printable ASCII
// and space, or a '%' not followed by two hex digits: such a value was not
// encoded, and guessing what it meant would hand a reader the wrong id.
func DecodeHeaderValue(v string) (string, error) {
	escapes := 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '%':
			if i+2 >= len(v) || !isHex(v[i+1]) || !isHex(v[i+2]) {
				return "", fmt.Errorf("%w: %q has a '%%' at byte %d that two hex digits do not follow", ErrHeaderValue, v, i)
			}
			escapes++
			i += 2
		case c < ' ' || c > '~':
			return "", fmt.Errorf("%w: %q has byte 0x%02x at %d, outside printable ASCII", ErrHeaderValue, v, c, i)
		}
	}
	if escapes == 0 {
		return v, nil
	}
	b := make([]byte, 0, len(v)-2*escapes)
	for i := 0; i < len(v); i++ {
		if v[i] == '%' {
			b = append(b, unhex(v[i+1])<<4|unhex(v[i+2]))
			i += 2
			continue
		}
		b = append(b, v[i])
	}
	return string(b), nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// TriggerOfHeader reads what the headers of an outbox event say about its
// trigger, ids decoded: every field but CreatedAt, which only the body
// carries. The body is the authoritative trigger (ParseTrigger); this is
// for a reader that has only the headers, or a body it cannot parse.
func TriggerOfHeader(h natsclient.Header) (Trigger, error) {
	var t Trigger
	var err error
	if t.OutboxID, err = strconv.ParseInt(h.Get(HeaderOutboxID), 10, 64); err != nil || t.OutboxID <= 0 {
		return Trigger{}, fmt.Errorf("nats: header %s %q is not an outbox id", HeaderOutboxID, h.Get(HeaderOutboxID))
	}
	if t.ConversationID, err = DecodeHeaderValue(h.Get(HeaderConversationID)); err != nil {
		return Trigger{}, fmt.Errorf("nats: header %s: %w", HeaderConversationID, err)
	}
	if t.ConversationID == "" {
		return Trigger{}, fmt.Errorf("nats: header %s is missing or empty", HeaderConversationID)
	}
	if t.MessageID, err = DecodeHeaderValue(h.Get(HeaderMessageID)); err != nil {
		return Trigger{}, fmt.Errorf("nats: header %s: %w", HeaderMessageID, err)
	}
	t.Reason = Reason(h.Get(HeaderReason))
	// Nats-Msg-Id is "outbox-<id>[-<announcement>]" (Trigger.MsgID).
	if rest, ok := strings.CutPrefix(h.Get(HeaderMsgID), "outbox-"+strconv.FormatInt(t.OutboxID, 10)+"-"); ok {
		t.Announcement = rest
	}
	return t, nil
}
