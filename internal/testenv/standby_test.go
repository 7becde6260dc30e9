package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestPrimaryWithStandbyFailsOverWithEveryAcknowledgedCommit(t *testing.T) {
	t.Parallel()
	ha := testenv.PrimaryWithStandby(t, testenv.HAOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var port int
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, ha.Primary.Port(), port, "DB.URL reaches the primary")
	for i := range 20 {
		_, err := ha.DB.Pool.Exec(ctx, `INSERT INTO users (name) VALUES ($1)`, fmt.Sprintf("user-%d", i))
		require.NoError(t, err)
	}

	ha.Failover(t)
	require.False(t, ha.Primary.Running(), "the killed primary stays down")
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Equal(t, ha.Standby.Port(), port, "after the failover DB.Pool reaches the promoted standby")
	var n int
	require.NoError(t, ha.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM users`).Scan(&n))
	require.Equal(t, 20, n, "every commit the primary acknowledged survived the failover")
	_, err := ha.DB.Pool.Exec(ctx, `INSERT INTO users (name) VALUES ('after')`)
	require.NoError(t, err, "the promoted standby takes writes")
}

func TestPrimaryWithStandbyHoldsTheMigratedSchemaOnBoth(t *testing.T) {
	t.Parallel()
	ha := testenv.PrimaryWithStandby(t, testenv.HAOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, err := ha.DB.Pool.Exec(ctx, `INSERT INTO users (name) VALUES ('on-the-primary')`)
	require.NoError(t, err)
	require.NoError(t, ha.Primary.WaitCaughtUp(ctx, ha.Standby))
	conn, err := pgx.Connect(ctx, ha.Standby.URL(ha.DB.Name))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM users WHERE name = 'on-the-primary'`).Scan(&n))
	require.Equal(t, 1, n, "the standby reads what the primary committed")
	var walLevel string
	require.NoError(t, conn.QueryRow(ctx, `SHOW wal_level`).Scan(&walLevel))
	require.Equal(t, "logical", walLevel, "the standby can become a primary the relay reads from")

	// A paused standby at the end of the test is resumed before the
	// servers stop, so the cleanup cannot hang.
	require.NoError(t, ha.Standby.PauseWALReceiver(ctx))
}
