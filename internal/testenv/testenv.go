// Package testenv gives tests a real PostgreSQL and a real NATS JetStream:
// a throwaway cluster started once per test package (or the server named by
// BATON_TEST_DATABASE_URL), a fresh migrated database per test, and an
// embedded NATS server per test (or BATON_TEST_NATS_URL).
package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/migrations"
)

const templateDB = "baton_template"

var (
	serverOnce sync.Once
	serverErr  error
	adminURL   string // a URL to the "postgres" database of the server
	cluster    *pgcluster.Cluster
	clusterDir string

	templateOnce sync.Once
	templateErr  error

	dbCounter atomic.Int64
)

// Main runs the package's tests, stops the package's Postgres cluster and
// removes the package's copies of Baton's binary afterwards, and fails the
// run when the tests passed but left goroutines behind (goleak). Every test package uses it from TestMain:
// os.Exit(testenv.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	afterMu.Lock()
	fns := afterAll
	afterAll = nil
	afterMu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
	removeBinaries()
	if cluster != nil {
		_ = cluster.Stop(pgcluster.Fast)
		_ = os.RemoveAll(clusterDir)
	}
	if code == 0 {
		if err := goleak.Find(
			// pgx pools close their background health checks asynchronously.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).triggerHealthCheck.func1"),
			// A JetStream server shut down while a stream was being placed
			// (clustered streams are created asynchronously) can leave that
			// stream's file store flushing, and with it the server's
			// registration in the shared access-time service: the server
			// itself and every connection are gone (a server that was not
			// shut down leaves its accept loops, which this still finds).
			goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
			goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: "+err.Error())
			code = 1
		}
	}
	return code
}

var (
	afterMu  sync.Mutex
	afterAll []func()
)

// AfterAll registers fn to run once the package's tests have run, before
// Main looks for leaked goroutines, last registered first: it stops what
// a package started for all its tests (a server of its own, what an
// Example used).
func AfterAll(fn func()) {
	afterMu.Lock()
	defer afterMu.Unlock()
	afterAll = append(afterAll, fn)
}

func startServer() error {
	serverOnce.Do(func() {
		if u := os.Getenv("BATON_TEST_DATABASE_URL"); u != "" {
			adminURL = u
			return
		}
		dir, err := os.MkdirTemp("", "baton-test-pg-")
		if err != nil {
			serverErr = err
			return
		}
		clusterDir = dir
		c, err := pgcluster.New(pgcluster.Options{Dir: filepath.Join(dir, "data")})
		if err != nil {
			serverErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			serverErr = err
			return
		}
		ctx := context.Background()
		if err := c.Init(ctx); err != nil {
			serverErr = err
			return
		}
		if err := c.Start(ctx); err != nil {
			serverErr = err
			return
		}
		cluster = c
		adminURL = c.URL("postgres")
	})
	return serverErr
}

// urlFor returns base with its database replaced by db.
func urlFor(base, db string) string {
	u, err := url.Parse(base)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + db
	return u.String()
}

func prepareTemplate(ctx context.Context) error {
	templateOnce.Do(func() {
		conn, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			templateErr = err
			return
		}
		defer conn.Close(ctx)
		// A template left over from an earlier run against an external
		// server may hold old migrations: build it anew.
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+templateDB+" WITH (FORCE)")
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+templateDB); err != nil {
			templateErr = fmt.Errorf("create template database: %w", err)
			return
		}
		pool, err := pgxpool.New(ctx, urlFor(adminURL, templateDB))
		if err != nil {
			templateErr = err
			return
		}
		defer pool.Close()
		if _, err := migrations.Up(ctx, pool); err != nil {
			templateErr = err
		}
	})
	return templateErr
}

// DB is a fresh, migrated database of its own for one test.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// Database creates a fresh migrated database for t and drops it (and any
// replication slot in it) when t ends.
func Database(t testing.TB) *DB {
	t.Helper()
	db, err := newDatabase()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(db.drop)
	return db
}

// ExampleDatabase is Database for an Example function, which has no
// testing.T: the database is dropped once the package's tests have run
// (Main), and a failure panics, which fails the example.
func ExampleDatabase() *DB {
	db, err := newDatabase()
	if err != nil {
		panic("testenv: " + err.Error())
	}
	AfterAll(db.drop)
	return db
}

func newDatabase() (*DB, error) {
	ctx := context.Background()
	if err := startServer(); err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	if err := prepareTemplate(ctx); err != nil {
		return nil, fmt.Errorf("prepare template database: %w", err)
	}
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), dbCounter.Add(1))
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	for i := 0; ; i++ {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+templateDB)
		if err == nil || i > 50 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	dbURL := urlFor(adminURL, name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	return &DB{Name: name, URL: dbURL, Pool: pool}, nil
}

// drop closes the pool and drops the database.
func (db *DB) drop() {
	db.Pool.Close()
	DropDatabase(adminURL, db.Name)
}

// DropDatabase drops db with its replication slots, ignoring errors: it is
// cleanup.
func DropDatabase(admin, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for i := 0; i < 20; i++ {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, db)
		_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, db)
		var left int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, db).Scan(&left)
		if left == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
}

// EmptyDatabase creates a database with no migrations applied, dropped
// when t ends, and returns its URL.
func EmptyDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	if err := startServer(); err != nil {
		t.Fatalf("testenv: start PostgreSQL: %v", err)
	}
	name := fmt.Sprintf("e_%d_%d", os.Getpid(), dbCounter.Add(1))
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() { DropDatabase(adminURL, name) })
	return urlFor(adminURL, name)
}
