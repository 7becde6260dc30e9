package schema

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Bounds the producer functions (migration 00015) hold every caller to:
// the API, the Go producer and the SQL producer alike. The API applies its
// own, lower limit on content (--max-content-bytes, at most this one).
const (
	// MaxContentBytes is the largest content of a user message, in bytes
	// of UTF-8: 1 MiB. Larger is ErrContentTooLarge (SQLSTATE PB005).
	MaxContentBytes = 1 << 20
	// MaxTitleLength is the longest conversation title, in characters.
	MaxTitleLength = 500
	// MaxUserIDLength is the longest user id the SQL producer takes, in
	// characters (the users table may hold itself to fewer).
	MaxUserIDLength = 1000
)

// SQLSTATEs the producer functions raise, each before anything is
// written, with a message that says what to fix
// (docs/reference/sql-producer.md). PB is an implementation-defined class
// that no PostgreSQL error uses.
const (
	// SQLStateBadUserID: the user id is empty, has a control character or
	// is too long.
	SQLStateBadUserID = "PB001"
	// SQLStateBadConversationID: the conversation id breaks the rules of
	// ValidateID.
	SQLStateBadConversationID = "PB002"
	// SQLStateBadMessageID: the message id breaks the rules of ValidateID.
	SQLStateBadMessageID = "PB003"
	// SQLStateEmptyContent: the content is empty.
	SQLStateEmptyContent = "PB004"
	// SQLStateContentTooLarge: the content is over MaxContentBytes.
	SQLStateContentTooLarge = "PB005"
	// SQLStateBadTitle: the title is over MaxTitleLength.
	SQLStateBadTitle = "PB006"
	// SQLStateBadDoubleTexting: the double texting policy is not one of
	// DoubleTextingPolicies.
	SQLStateBadDoubleTexting = "PB007"
	// SQLStateReservedMessageID: the message id starts with a prefix of
	// the server's own messages ("reply_", "error_"); see ValidateID.
	SQLStateReservedMessageID = "PB013"
	// SQLStateUnknownConversation: the user has no conversation of that id.
	SQLStateUnknownConversation = "PB010"
	// SQLStateConflict: the user's message id was used for other content
	// or in another conversation.
	SQLStateConflict = "PB011"
	// SQLStateTurnRunning: the conversation's double texting is reject,
	// and a turn of it runs or waits (for a worker, or for an approval,
	// which the message names).
	SQLStateTurnRunning = "PB012"
)

// What PostgreSQL answers to text it cannot hold: bytes that are not
// UTF-8 (U+0000 among them) in a text value, "\u0000" in a JSON one.
const (
	sqlStateBadEncoding    = "22021"
	sqlStateUntranslatable = "22P05"
)

var (
	// ErrInvalid: an id, a title or the content breaks the producer's rules.
	ErrInvalid = errors.New("invalid")
	// ErrContentTooLarge: the content is over MaxContentBytes.
	ErrContentTooLarge = errors.New("content too large")
)

// ProducerError is an error a producer function raised: its SQLSTATE and
// its message, which says what to fix. errors.Is finds the package's error
// of its kind in it (ErrNotFound, ErrConflict, ErrInvalid,
// ErrContentTooLarge, ErrTurnRunning, ErrReservedID, ErrBadText), and
// errors.As the driver's *pgconn.PgError.
type ProducerError struct {
	// Code is the SQLSTATE, one of the SQLState constants.
	Code string
	// Message says what was wrong and how to fix it.
	Message string
	kind    error
	pgErr   *pgconn.PgError
}

func (e *ProducerError) Error() string   { return e.Message }
func (e *ProducerError) Unwrap() []error { return []error{e.kind, e.pgErr} }

// producerError translates an error of a producer function at the edge:
// a SQLSTATE of the producer into a *ProducerError, anything else wrapped
// with what was being done.
func producerError(doing string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		var kind error
		switch pgErr.Code {
		case SQLStateUnknownConversation:
			kind = ErrNotFound
		case SQLStateConflict:
			kind = ErrConflict
		case SQLStateContentTooLarge:
			kind = ErrContentTooLarge
		case SQLStateTurnRunning:
			kind = ErrTurnRunning
		case SQLStateReservedMessageID:
			kind = ErrReservedID
		case sqlStateBadEncoding, sqlStateUntranslatable:
			// U+0000 or bytes that are not UTF-8, which a Go caller can
			// send and no text column holds.
			kind = ErrBadText
		case SQLStateBadUserID, SQLStateBadConversationID, SQLStateBadMessageID, SQLStateEmptyContent, SQLStateBadTitle, SQLStateBadDoubleTexting:
			kind = ErrInvalid
		}
		if kind != nil {
			return &ProducerError{Code: pgErr.Code, Message: pgErr.Message, kind: kind, pgErr: pgErr}
		}
	}
	return fmt.Errorf("%s: %w", doing, err)
}
