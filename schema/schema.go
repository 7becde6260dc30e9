// Package schema is Baton's data model and the queries that the producer,
// the API, the relay and the consumers share. Every operation a caller may
// want inside its own transaction takes an Executor (a pgx.Tx, a pool or a
// connection), in the shape of River's InsertTx.
package schema

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Executor runs queries: pgx.Tx, *pgx.Conn and *pgxpool.Pool all qualify.
type Executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
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
)

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
