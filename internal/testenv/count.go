package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Querier is what Count reads with: a *pgxpool.Pool, a *pgx.Conn, a
// pgx.Tx, or any of Baton's executors.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Count runs query, which returns one number (a count(*), most often), and
// returns it; an error fails t with the query in the message.
func Count(t testing.TB, db Querier, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("testenv: count %s: %v", query, err)
	}
	return n
}
