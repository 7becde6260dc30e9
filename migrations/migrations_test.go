package migrations_test

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// emptyDatabase returns a pool on a database with no migrations applied.
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), testenv.EmptyDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestUpTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)

	first, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.NotEmpty(t, first.Applied, "the first run applies every migration")

	second, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, second.Applied, "the second run must apply nothing")
	require.Equal(t, first.Version, second.Version)

	st, err := migrations.Status(ctx, pool)
	require.NoError(t, err)
	for _, s := range st {
		require.True(t, s.Applied, "migration %s should be applied", s.Name)
	}
}

func TestConcurrentUpDoesNotFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)

	const runs = 4
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	applied := make(chan int, runs)
	for range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := migrations.Up(ctx, pool)
			errs <- err
			applied <- len(res.Applied)
		}()
	}
	wg.Wait()
	close(errs)
	close(applied)
	for err := range errs {
		require.NoError(t, err)
	}
	total := 0
	for n := range applied {
		total += n
	}
	entries, err := migrations.FS().ReadDir(".")
	require.NoError(t, err)
	sqlFiles := 0
	for _, e := range entries {
		if !e.IsDir() && len(e.Name()) > 4 && e.Name()[len(e.Name())-4:] == ".sql" {
			sqlFiles++
		}
	}
	require.Equal(t, sqlFiles, total, "each migration is applied exactly once across concurrent runs")
}
