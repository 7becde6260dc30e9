package testenv_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func TestDatabasesAreSeparateAndMigrated(t *testing.T) {
	t.Parallel()
	a, b := testenv.Database(t), testenv.Database(t)
	require.NotEqual(t, a.Name, b.Name)
	ctx := context.Background()
	_, err := a.Pool.Exec(ctx, `INSERT INTO users (name) VALUES ('only-in-a')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM users`).Scan(&n))
	require.Zero(t, n, "each test has its own database")
	var walLevel string
	require.NoError(t, a.Pool.QueryRow(ctx, `SHOW wal_level`).Scan(&walLevel))
	require.Equal(t, "logical", walLevel)
}

func TestThreeNodeClusterKeepsAReplicatedStreamThroughANodeRestart(t *testing.T) {
	t.Parallel()
	nodes := testenv.NATSCluster(t, 3)
	_, js := nodes[0].Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var s jetstream.Stream
	var err error
	// The cluster elects its meta leader after start: retry until it takes
	// the stream.
	for s == nil {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		s, _, err = batonnats.ProvisionStream(actx, js, batonnats.StreamConfig{Name: "R3", SubjectPrefix: "r3", Replicas: 3}, batonnats.ProvisionOptions{})
		acancel()
		if err != nil {
			require.NoError(t, ctx.Err(), "stream with 3 replicas not created: %v", err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)

	_, err = js.Publish(ctx, "r3.0.x", []byte("one"))
	require.NoError(t, err)
	nodes[2].Stop()
	// Two of three nodes still form a quorum.
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = js.Publish(actx, "r3.0.x", []byte("two"))
		acancel()
		if err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "publish with one node down: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	nodes[2].Start()
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		info, err = s.Info(actx)
		acancel()
		if err == nil && info.State.Msgs == 2 {
			break
		}
		require.NoError(t, ctx.Err(), "stream state after restart: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}
