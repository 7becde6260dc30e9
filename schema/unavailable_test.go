package schema_test

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

// TestIsUnavailableTellsALostServerFromAMistake: the errors of a server
// that went away mid-request (killed in a failover, restarting) ask for a
// retry; an error in the request does not.
func TestIsUnavailableTellsALostServerFromAMistake(t *testing.T) {
	for _, err := range []error{
		// The connection broke earlier in the same operation: what pgx
		// returns on a connection whose server was SIGKILLed mid-request.
		fmt.Errorf("insert message: %w", pgconn.ErrConnClosed),
		fmt.Errorf("commit: %w", io.ErrUnexpectedEOF),
		fmt.Errorf("dial: %w", syscall.ECONNREFUSED),
		&pgconn.PgError{Code: "57P01"}, // terminating connection: admin shutdown
		&pgconn.PgError{Code: "08006"},
		&pgconn.PgError{Code: "25006"}, // read-only transaction: a standby
	} {
		require.True(t, schema.IsUnavailable(err), "%v", err)
	}
	for _, err := range []error{
		nil,
		errors.New("boom"),
		&pgconn.PgError{Code: "42601"}, // syntax error
		&pgconn.PgError{Code: "23505"}, // unique violation
	} {
		require.False(t, schema.IsUnavailable(err), "%v", err)
	}
}
