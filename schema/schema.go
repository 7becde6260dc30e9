// Package schema is Baton's data model and the queries that the producer,
// the API, the relay and the consumers share. Every operation a caller may
// want inside its own transaction takes an Executor (a pgx.Tx, a pool or a
// connection), in the shape of River's InsertTx.
package schema

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Executor runs queries: pgx.Tx, *pgx.Conn and *pgxpool.Pool all qualify.
type Executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner runs queries and starts transactions: *pgxpool.Pool and
// *pgx.Conn qualify, and so does a pgx.Tx, whose Begin starts a savepoint.
// The operations that need a transaction of their own (ClaimTurn,
// FinalizeTurn, Prune) take one.
type Beginner interface {
	Executor
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Errors of the domain; driver errors are translated into these at the edge.
var (
	// ErrNotFound: the row does not exist, or belongs to someone else.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the ID exists with other content or elsewhere.
	ErrConflict = errors.New("conflict")
)

// Postgres error codes used to translate driver errors.
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
	pgLockNotAvailable    = "55P03"
)

// setLockTimeout makes each lock tx waits for fail with 55P03
// (pgLockNotAvailable) after d, until tx ends.
func setLockTimeout(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	_, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	return err
}

// noWait is query with its lock clause lock made to skip locked rows.
func noWait(query, lock string) string {
	if strings.Count(query, lock) != 1 {
		panic("schema: the lock clause of a batched statement is not where it was")
	}
	return strings.Replace(query, lock, strings.TrimSuffix(lock, ")")+" SKIP LOCKED)", 1)
}

// IsForeignKeyViolation reports whether err is a foreign key violation,
// which finalize treats as "the conversation was deleted mid-turn".
func IsForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgForeignKeyViolation
}

// IsUniqueViolation reports whether err is a unique violation.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgUniqueViolation
}

// IsUnavailable reports whether err says the database cannot serve the
// request right now, as opposed to a mistake in it: no connection (the
// server is down, restarting or failing over), a server shutting down, or a
// standby that cannot write (a multi-host URL that reached the old primary
// while it is demoted). Retrying the same request later is the answer.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutting down, cannot connect now
			pgErr.Code == "25006": // read-only transaction: a standby
			return true
		}
		return false
	}
	// ErrConnClosed: the connection broke earlier in the same operation (a
	// server killed mid-request), so the driver gives up on it.
	return pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
