package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/internal/pgcluster"
)

// Postgres is a PostgreSQL cluster of one benchmark.
type Postgres struct {
	cluster *pgcluster.Cluster
	dbs     atomic.Int64
}

// StartPostgres starts a durable PostgreSQL cluster for tb (fsync,
// synchronous commit and full page writes on, as in production, unlike
// the tests' clusters), with extra server settings, and stops it when tb
// ends.
func StartPostgres(tb testing.TB, settings map[string]string) *Postgres {
	tb.Helper()
	dir, err := os.MkdirTemp("", "baton-bench-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	// The server runs as the postgres user when the benchmark runs as
	// root: it must reach its data directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	c, err := pgcluster.New(pgcluster.Options{Dir: filepath.Join(dir, "data"), Durable: true, Settings: settings})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Init(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Stop(pgcluster.Fast) })
	return &Postgres{cluster: c}
}

// BinDir is the folder of the server's programs (pg_recvlogical, ...).
func (p *Postgres) BinDir() string {
	d, _ := pgcluster.FindBinDir()
	return d
}

// DB is an empty database of a benchmark.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// Database creates an empty database; migrate it with the binary under
// test (Migrate), so that its schema is the one that binary expects.
func (p *Postgres) Database(tb testing.TB) *DB {
	tb.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("bench_%d", p.dbs.Add(1))
	conn, err := pgx.Connect(ctx, p.cluster.URL("postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("bench: create database %s: %v", name, err)
	}
	dbURL := p.cluster.URL(name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return &DB{Name: name, URL: dbURL, Pool: pool}
}

// Migrate applies the migrations of binary to db, as `baton migrate`
// does in a deployment.
func (db *DB) Migrate(tb testing.TB, binary string) {
	tb.Helper()
	if out, err := Run(binary, "migrate", "--database-url", db.URL, "--log-format", "json"); err != nil {
		tb.Fatalf("bench: %s migrate: %v\n%s", binary, err, out)
	}
}

// Count runs a query that returns one number.
func (db *DB) Count(tb testing.TB, query string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		tb.Fatalf("bench: %s: %v", query, err)
	}
	return n
}

// WaitCount polls query every interval until it returns want or within
// passes.
func (db *DB) WaitCount(tb testing.TB, want int64, within, interval time.Duration, query string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		n := db.Count(tb, query, args...)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("bench: %s returned %d after %s, want %d", query, n, within, want)
		}
		time.Sleep(interval)
	}
}

// WithHostPort returns dbURL with its host and port replaced, to reach the
// database through a proxy.
func WithHostPort(dbURL, hostPort string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(err)
	}
	u.Host = hostPort
	return u.String()
}

// WithParams returns dbURL with query parameters added, each "name=value":
// pgx reads pool settings (pool_max_conns) from them and sends the others
// to the server as settings of the session (plan_cache_mode).
func WithParams(dbURL string, params ...string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	for _, p := range params {
		name, value, _ := strings.Cut(p, "=")
		q.Set(name, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// HostPort is the host and port of dbURL.
func HostPort(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// BackendCPU is the processor time used so far by the server processes of
// db's open connections, by process; connections that closed are gone.
// Subtract an earlier BackendCPU with CPUSince.
func (db *DB) BackendCPU(tb testing.TB) map[int]time.Duration {
	tb.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = $1`, db.Name)
	if err != nil {
		tb.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		tb.Fatal(err)
	}
	cpu := map[int]time.Duration{}
	for _, pid := range pids {
		if d, err := CPU(int(pid)); err == nil {
			cpu[int(pid)] = d
		}
	}
	return cpu
}

// CPUSince is the processor time the processes of now used since before
// (all of it for a process that before does not have).
func CPUSince(now, before map[int]time.Duration) time.Duration {
	var total time.Duration
	for pid, d := range now {
		total += d - before[pid]
	}
	return total
}
