package pgcluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// newCluster starts a cluster of its own for t, stopped and removed when t
// ends. Standbys made from it with newStandby live in the same folder.
func newCluster(t *testing.T, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	// As root the server runs as postgres, which must reach the folder:
	// t.TempDir's parent is private, so use a folder of its own.
	dir, err := os.MkdirTemp("", "baton-pgcluster-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	opts.Dir = filepath.Join(dir, "primary")
	c, err := pgcluster.New(opts)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.Init(ctx))
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(pgcluster.Immediate) })
	return c
}

// newStandby makes a standby of primary for t, stopped when t ends.
func newStandby(t *testing.T, primary *pgcluster.Cluster, opts pgcluster.StandbyOptions) *pgcluster.Cluster {
	t.Helper()
	s, err := primary.Standby(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(pgcluster.Immediate) })
	return s
}

// testContext is a context that ends with t or after a minute.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
