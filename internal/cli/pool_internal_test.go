package cli

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/testenv"
)

// TestAWorkersPoolHoldsSixteenConnectionsUnlessTheURLSaysOtherwise: the
// worker's turns queue for connections no more than a fast agent needs,
// and an operator's pool_max_conns wins.
func TestAWorkersPoolHoldsSixteenConnectionsUnlessTheURLSaysOtherwise(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	open := func(url string, maxConns int32) int32 {
		pool, err := openPoolSized(ctx, config.Database{DatabaseURL: url}, maxConns)
		require.NoError(t, err)
		defer pool.Close()
		return pool.Config().MaxConns
	}
	require.Equal(t, int32(16), open(db.URL, workerPoolConns(64)), "the default concurrency")
	require.Equal(t, int32(2), open(db.URL, workerPoolConns(2)), "no more connections than turns at once")
	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	require.Equal(t, int32(3), open(db.URL+sep+"pool_max_conns=3", workerPoolConns(64)), "the URL's pool size wins")
	require.Equal(t, int32(max(4, runtime.NumCPU())), open(db.URL, 0), "other commands keep pgx's default")
}
