package cli

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// parts returns the long-running services `baton dev` runs beside the API.
func (c *devCmd) parts(pool *pgxpool.Pool, dbURL, natsURL string, env *Env) []func(context.Context) error {
	return nil
}
