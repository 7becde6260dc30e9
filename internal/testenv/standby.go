package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/migrations"
)

// haDatabase is the name of the migrated database of PrimaryWithStandby.
const haDatabase = "baton"

// HAOptions configure PrimaryWithStandby.
type HAOptions struct {
	// Synchronous makes the standby synchronous: no commit on the primary
	// returns before the standby has flushed it, so every acknowledged
	// commit survives a Failover. Defaults to false: the standby streams
	// asynchronously, and a failover may lose the last commits.
	Synchronous bool
	// Settings are extra server settings for both servers (see
	// pgcluster.Options.Settings). Defaults to none.
	Settings map[string]string
}

// HA is a primary PostgreSQL server and its streaming standby, both of
// their own for one test, with a migrated database on them: for tests of
// what Baton does when its database fails over.
type HA struct {
	// Primary takes the writes until Failover kills it.
	Primary *pgcluster.Cluster
	// Standby follows Primary through a replication slot of its own, and
	// takes reads; Failover promotes it.
	Standby *pgcluster.Cluster
	// DB is the migrated database. DB.URL names both servers, the primary
	// first, with target_session_attrs=read-write (see
	// pgcluster.MultiHostURL), and DB.Pool is opened on it: a new
	// connection reaches whichever server is the primary, also after
	// Failover. Standby.URL(DB.Name) reads from the standby alone.
	DB *DB
}

// PrimaryWithStandby starts a primary, creates and migrates a database on
// it, makes a standby of it with pg_basebackup and returns them once the
// standby streams. Both servers, their folder and the pool stop or go when
// t ends; a paused standby is resumed first.
func PrimaryWithStandby(t testing.TB, opts HAOptions) *HA {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "baton-test-ha-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// As root the servers run as postgres, which must reach their folders.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	primary, err := pgcluster.New(pgcluster.Options{Dir: filepath.Join(dir, "primary"), Settings: opts.Settings})
	if err != nil {
		t.Fatalf("testenv: prepare the primary: %v", err)
	}
	if err := primary.Init(ctx); err != nil {
		t.Fatalf("testenv: initdb the primary: %v", err)
	}
	if err := primary.Start(ctx); err != nil {
		t.Fatalf("testenv: start the primary: %v", err)
	}
	t.Cleanup(func() { _ = primary.Stop(pgcluster.Immediate) })
	// Migrated before the base backup, so the standby starts with the
	// schema instead of replaying it.
	if err := createMigrated(ctx, primary); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	standby, err := primary.Standby(ctx, pgcluster.StandbyOptions{
		Dir:         filepath.Join(dir, "standby"),
		Synchronous: opts.Synchronous,
	})
	if err != nil {
		t.Fatalf("testenv: make the standby: %v", err)
	}
	t.Cleanup(func() { _ = standby.Stop(pgcluster.Immediate) })
	url := pgcluster.MultiHostURL(haDatabase, primary, standby)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("testenv: open pool on %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	return &HA{
		Primary: primary,
		Standby: standby,
		DB:      &DB{Name: haDatabase, URL: url, Pool: pool},
	}
}

// createMigrated creates the database haDatabase on c and applies the
// migrations to it.
func createMigrated(ctx context.Context, c *pgcluster.Cluster) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the primary: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+haDatabase); err != nil {
		return fmt.Errorf("create database %s: %w", haDatabase, err)
	}
	pool, err := pgxpool.New(ctx, c.URL(haDatabase))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil {
		return fmt.Errorf("migrate database %s: %w", haDatabase, err)
	}
	return nil
}

// Failover kills the primary (SIGKILL of every one of its processes) and
// promotes the standby, as an operator or a failover manager would after
// losing the primary's machine. It returns once DB.URL reaches the
// promoted standby; DB.Pool drops its connections to the dead primary.
// The killed primary stays down.
func (h *HA) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Primary.Stop(pgcluster.Kill); err != nil {
		t.Fatalf("testenv: kill the primary: %v", err)
	}
	if err := h.Standby.Promote(ctx); err != nil {
		t.Fatalf("testenv: promote the standby: %v", err)
	}
	h.DB.Pool.Reset()
	conn, err := pgx.Connect(ctx, h.DB.URL)
	if err != nil {
		t.Fatalf("testenv: connect through %s after the failover: %v", h.DB.URL, err)
	}
	defer conn.Close(ctx)
	var port int
	if err := conn.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil {
		t.Fatalf("testenv: after the failover: %v", err)
	}
	if port != h.Standby.Port() {
		t.Fatalf("testenv: after the failover %s reached port %d, want the promoted standby's %d", h.DB.URL, port, h.Standby.Port())
	}
}
