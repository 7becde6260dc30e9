// Package migrations holds Baton's ordered schema migrations, embedded in
// the binary, and applies them with goose. Never edit a migration that has
// been released: add a new file.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() embed.FS { return files }

// newProvider opens a goose provider over pool. The Postgres session locker
// (an advisory lock) makes concurrent runs from several processes safe: the
// second waits, then finds nothing left to do.
func newProvider(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	p, err := goose.NewProvider(database.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return p, db, nil
}

// applyGrants gives every component's role that exists what baton_grants
// says, after every run: also when the migrations had nothing to do, so
// roles made since, and a grant made or revoked by hand, end up as the
// decisions say. A database migrated to before 00007 has no decisions.
const applyGrants = `DO $$
BEGIN
  IF to_regproc('baton_apply_grants') IS NOT NULL THEN
    PERFORM baton_apply_grants();
  END IF;
END
$$`

// Result says what one migration run did.
type Result struct {
	Applied []int64
	Version int64
}

// Up applies every migration not applied yet. Running it twice is a no-op.
func Up(ctx context.Context, pool *pgxpool.Pool) (Result, error) {
	p, db, err := newProvider(pool)
	if err != nil {
		return Result{}, err
	}
	defer db.Close()
	res, err := p.Up(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("apply migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, applyGrants); err != nil {
		return Result{}, fmt.Errorf("apply the grants of baton_grants (migration 00007) to the roles that exist: %w", err)
	}
	var out Result
	for _, r := range res {
		out.Applied = append(out.Applied, r.Source.Version)
	}
	out.Version, err = p.GetDBVersion(ctx)
	return out, err
}

// MigrationStatus is one migration and whether it is applied.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

// Status lists every embedded migration with its state.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	p, db, err := newProvider(pool)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read migration status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(st))
	for _, s := range st {
		out = append(out, MigrationStatus{
			Version: s.Source.Version,
			Name:    s.Source.Path,
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}
