package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/migrations"
)

type migrateCmd struct {
	config.Database
	Up     migrateUpCmd     `cmd:"" default:"withargs" help:"Apply every migration not applied yet (the default)."`
	Status migrateStatusCmd `cmd:"" help:"List migrations and whether each is applied."`
}

type migrateUpCmd struct{}

func (migrateUpCmd) Run(ctx context.Context, m *migrateCmd, env *Env) error {
	pool, err := openPool(ctx, m.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := migrations.Up(ctx, pool)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(env.Stdout, "database is up to date at version %d\n", res.Version)
		return nil
	}
	fmt.Fprintf(env.Stdout, "applied %d migration(s); database is at version %d\n", len(res.Applied), res.Version)
	return nil
}

type migrateStatusCmd struct{}

func (migrateStatusCmd) Run(ctx context.Context, m *migrateCmd, env *Env) error {
	pool, err := openPool(ctx, m.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := migrations.Status(ctx, pool)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tSTATE\tFILE")
	for _, s := range st {
		state := "pending"
		if s.Applied {
			state = "applied"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", s.Version, state, s.Name)
	}
	return w.Flush()
}
