package bench

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestWireCountsStatementsRoundTripsAndTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	w := NewWire(t, HostPort(db.URL))
	conn, err := pgx.Connect(ctx, WithHostPort(db.URL, w.Addr()))
	require.NoError(t, err)
	defer conn.Close(ctx)
	step := func(name string, want WireCounts, f func()) {
		t.Helper()
		before := w.Counts()
		f()
		require.Equal(t, want, w.Counts().Sub(before), name)
	}
	var n int
	step("a statement prepared, then executed: two round trips", WireCounts{Statements: 1, RoundTrips: 2, Transactions: 1}, func() {
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int + 1`, 1).Scan(&n))
	})
	step("the same statement again: one round trip", WireCounts{Statements: 1, RoundTrips: 1, Transactions: 1}, func() {
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int + 1`, 2).Scan(&n))
	})
	step("a transaction of two statements", WireCounts{Statements: 2, Control: 2, RoundTrips: 4, Transactions: 1}, func() {
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT $1::int + 1`, 3).Scan(&n); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT $1::int + 1`, 4).Scan(&n)
		}))
	})
	step("a simple query", WireCounts{Statements: 1, RoundTrips: 1, Transactions: 1}, func() {
		_, err := conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
	})
}
