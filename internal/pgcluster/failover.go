package pgcluster

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Promote ends recovery on a standby: it becomes a primary on a timeline
// of its own, takes writes and no longer follows the cluster it was made
// from. It returns once the server takes writes. Kill the old primary
// first (Stop(Kill)) unless the test wants two primaries.
func (c *Cluster) Promote(ctx context.Context) error {
	var promoted bool
	err := c.withConn(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&promoted)
	})
	if err != nil {
		return fmt.Errorf("pgcluster: promote the standby on port %d: %w", c.opts.Port, err)
	}
	if !promoted {
		return fmt.Errorf("pgcluster: promote the standby on port %d: still in recovery after 60s; %s", c.opts.Port, c.logTail())
	}
	return nil
}

// MultiHostURL returns one URL for database db as the superuser on all the
// clusters, in order, with target_session_attrs=read-write: a client tries
// them one after the other and keeps the first that takes writes, so a new
// connection reaches whichever is the primary, before and after a
// failover. Clients built on libpq or pgx understand it.
func MultiHostURL(db string, clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(c.Port())
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","), url.PathEscape(db))
}
