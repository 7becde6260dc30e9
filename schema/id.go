package schema

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The rules of the ids and the text that clients choose, held by every
// write path: the API checks them before anything reaches the database,
// and the producer functions hold the SQL producer to the same rules
// (baton_check_id, migrations 00015 and 00024). docs/reference/http-api.md
// ("Ids and text") is their one place for people.

// MaxIDLength is the longest conversation or message ID, in characters.
const MaxIDLength = 200

// Prefixes of the ids the server gives the messages it writes: a reply
// (ReplyID) and a turn's visible error (ErrorMessageID). A user message
// may not take one, so that no two messages of a conversation ever show
// one id.
var reservedMessagePrefixes = []string{"reply_", "error_"}

var (
	// ErrReservedID: a message id takes a prefix of the ids the server
	// gives its own messages. It is an ErrInvalid too.
	ErrReservedID = fmt.Errorf("%w: the id is reserved for the server's messages", ErrInvalid)
	// ErrBadText: text that cannot be stored as it was sent: U+0000,
	// invalid UTF-8 (Go's strings carry what a client's bytes were). It
	// is an ErrInvalid too.
	ErrBadText = fmt.Errorf("%w: the text cannot be stored", ErrInvalid)
)

// ValidateID checks a client-chosen conversation or message ID: 1 to 200
// characters of valid UTF-8 without control characters, without leading
// or trailing whitespace (which does not survive NATS headers and is never
// what a user meant), and neither "." nor ".." (URLs drop such a path
// segment, so that the id could be written but never read). A message id
// may not start with "reply_" or "error_", the prefixes of the server's
// own messages (ErrReservedID). Dots, '*', '>', '/', inner spaces and
// non-ASCII letters are allowed. The producer functions hold ids to the
// same rules in SQL (baton_check_id); this lets a caller answer a bad id
// before it reaches the database.
func ValidateID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("%s id is empty: give 1 to %d characters", kind, MaxIDLength)
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%s id is not valid UTF-8", kind)
	}
	if n := utf8.RuneCountInString(id); n > MaxIDLength {
		return fmt.Errorf("%s id is %d characters long: the limit is %d", kind, n, MaxIDLength)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s id contains the control character %U: use printable characters only", kind, r)
		}
	}
	first, _ := utf8.DecodeRuneInString(id)
	last, _ := utf8.DecodeLastRuneInString(id)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("%s id %q starts or ends with whitespace: remove it", kind, id)
	}
	if id == "." || id == ".." {
		return fmt.Errorf("%s id %q cannot be a part of a URL's path (URLs drop it): choose another", kind, id)
	}
	if kind == "message" {
		for _, p := range reservedMessagePrefixes {
			if strings.HasPrefix(id, p) {
				return &ruleError{kind: ErrReservedID,
					message: fmt.Sprintf("message id %q starts with %q, which only the server's replies and errors use: choose another id", id, p)}
			}
		}
	}
	return nil
}

// ValidateText checks text a client sends to be stored (a message's
// content, a title): valid UTF-8 without U+0000, which PostgreSQL's text
// cannot hold. The API refuses invalid UTF-8 and unpaired surrogates in
// the request itself, before they could become U+FFFD; this is the last
// word of every Go caller. Errors wrap ErrBadText.
func ValidateText(field, s string) error {
	if !utf8.ValidString(s) {
		return &ruleError{kind: ErrBadText, message: field + " is not valid UTF-8"}
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return &ruleError{kind: ErrBadText, message: fmt.Sprintf("%s holds the character U+0000 at byte %d, which cannot be stored: remove it", field, i)}
	}
	return nil
}

// ruleError is a broken rule of an id or a text: its message says what to
// fix, and errors.Is finds its kind (and ErrInvalid) in it.
type ruleError struct {
	kind    error
	message string
}

func (e *ruleError) Error() string { return e.message }
func (e *ruleError) Unwrap() error { return e.kind }
