package testenv_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure instead
// of ending the test, so a test can check what a helper fails with.
type fatalRecorder struct {
	testing.TB
	failures []string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func TestCountReturnsTheNumberTheQueryReturnsThroughAPoolOrATransaction(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO users (name) VALUES ('ann'), ('amy'), ('bob')`)
	require.NoError(t, err)
	require.Equal(t, 2, testenv.Count(t, db.Pool, `SELECT count(*) FROM users WHERE name LIKE $1`, "a%"))

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO users (name) VALUES ('ada')`)
	require.NoError(t, err)
	var q testenv.Querier = tx
	require.Equal(t, 3, testenv.Count(t, q, `SELECT count(*) FROM users WHERE name LIKE $1`, "a%"), "the transaction sees its own row")
	require.Equal(t, 2, testenv.Count(t, db.Pool, `SELECT count(*) FROM users WHERE name LIKE $1`, "a%"), "others do not, until it commits")
}

func TestCountFailsTheTestNamingTheQueryWhenItCannotRun(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	r := &fatalRecorder{TB: t}
	testenv.Count(r, db.Pool, `SELECT count(*) FROM no_such_table`)
	require.Len(t, r.failures, 1)
	require.Contains(t, r.failures[0], "SELECT count(*) FROM no_such_table", "the failure names the query")
	require.Contains(t, r.failures[0], `relation "no_such_table" does not exist`, "and says what went wrong")

	conn, err := pgx.Connect(context.Background(), db.URL)
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
	r = &fatalRecorder{TB: t}
	testenv.Count(r, conn, `SELECT count(*) FROM users`)
	require.Len(t, r.failures, 1, "a closed connection fails the count")
}
