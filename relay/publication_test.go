package relay

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// TestARelayThatMayNotCreateItsPublicationSaysWhatToRun: a relay running
// with only the rights it needs (replication, reading the outbox) finds
// the publication that `baton migrate` made; when it is missing, it stops
// with an error that says what to run, instead of retrying forever.
func TestARelayThatMayNotCreateItsPublicationSaysWhatToRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	b := setupWith(t, db.Pool, db.URL, "s_"+db.Name)
	role := "relay_" + db.Name
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN REPLICATION`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	_, err = db.Pool.Exec(ctx, `GRANT SELECT, UPDATE ON agent_outbox TO `+role)
	require.NoError(t, err)

	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cfg := b.cfg
	cfg.Publication = "missing_" + db.Name
	r, err := New(cfg, pool, b.relayConn(t))
	require.NoError(t, err)
	err = r.Run(ctx)
	require.Error(t, err, "a missing publication the relay may not create stops it")
	require.Contains(t, err.Error(), "run `baton migrate`")
	require.Contains(t, err.Error(), "CREATE PUBLICATION")
}
