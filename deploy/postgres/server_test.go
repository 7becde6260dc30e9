// Package postgres_test runs PostgreSQL configured from the files of
// deploy/postgres as shipped (baton.conf, tls.conf, pg_hba.conf), makes
// Baton's roles with roles.sql through psql, migrates as baton_migrator,
// and checks that each component's role can do what its code does and
// nothing else.
package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/deploy/deploytest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
)

// TestMain stops the package's server after the tests, before
// testenv.Main looks for leaked goroutines.
func TestMain(m *testing.M) {
	testenv.AfterAll(func() {
		if server != nil {
			_ = server.Stop(pgcluster.Fast)
			_ = os.RemoveAll(serverDir)
		}
	})
	os.Exit(testenv.Main(m))
}

// components are the roles roles.sql makes, by the name of their password
// variable; the first five are required, the last three optional.
var components = []string{"migrator", "api", "worker", "relay", "group", "status", "admin", "console"}

// maxDatabases bounds the databases the tests make: each gets a name of
// its own, baton_1 to baton_<max>, which take the place of the database
// name baton in pg_hba.conf.
const maxDatabases = 16

var (
	serverOnce sync.Once
	server     *pgcluster.Cluster
	serverDir  string
	serverErr  error
	passwords  = map[string]string{}
	databases  atomic.Int64
)

// startServer starts the package's PostgreSQL once: the settings of
// baton.conf and tls.conf (the TLS files are the ones pgcluster makes,
// under the names tls.conf gives), and the lines of pg_hba.conf with the
// loopback address in place of the example network.
func startServer(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	serverOnce.Do(func() {
		settings := map[string]string{}
		for _, f := range []string{"baton.conf", "tls.conf"} {
			kv, err := deploytest.ReadConf(f)
			if err != nil {
				serverErr = err
				return
			}
			for k, v := range kv {
				if strings.HasPrefix(k, "ssl_") && strings.HasSuffix(k, "_file") {
					v = filepath.Base(v) // relative to the data directory
				}
				settings[k] = v
			}
		}
		// The lines of pg_hba.conf, with the loopback address in place of
		// the example network and the tests' databases in place of baton.
		names := make([]string, maxDatabases)
		for i := range names {
			names[i] = fmt.Sprintf("baton_%d", i+1)
		}
		hba, err := deploytest.ReadHBA("pg_hba.conf", names...)
		if err != nil {
			serverErr = err
			return
		}
		for _, c := range components {
			passwords[c] = randomPassword()
		}
		serverDir, serverErr = os.MkdirTemp("", "baton-deploy-pg-")
		if serverErr != nil {
			return
		}
		// The server runs as the postgres user when the tests run as root.
		if serverErr = os.Chmod(serverDir, 0o755); serverErr != nil {
			return
		}
		c, err := pgcluster.New(pgcluster.Options{
			Dir: filepath.Join(serverDir, "data"), TLS: true, HBA: hba, Settings: settings,
		})
		if err != nil {
			serverErr = err
			return
		}
		ctx := context.Background()
		if serverErr = c.Init(ctx); serverErr != nil {
			return
		}
		if serverErr = c.Start(ctx); serverErr != nil {
			return
		}
		server = c
	})
	if serverErr != nil {
		t.Fatalf("start PostgreSQL from deploy/postgres: %v", serverErr)
	}
	return server
}

func randomPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// deployment is one database on the package's server, set up as an
// operator does: roles.sql, then `baton migrate` as baton_migrator.
type deployment struct {
	server *pgcluster.Cluster
	name   string
}

// newDatabase runs roles.sql for a database of its own, which it makes.
func newDatabase(t *testing.T) *deployment {
	t.Helper()
	c := startServer(t)
	n := databases.Add(1)
	require.LessOrEqual(t, n, int64(maxDatabases), "pg_hba.conf admits the roles to %d test databases: raise maxDatabases", maxDatabases)
	d := &deployment{server: c, name: fmt.Sprintf("baton_%d", n)}
	out, err := d.rolesSQL(t, components, nil)
	require.NoError(t, err, "roles.sql: %s", out)
	t.Cleanup(func() { testenv.DropDatabase(c.URL("postgres"), d.name) })
	return d
}

// rolesSQL runs roles.sql as the superuser through psql, with the
// passwords of the given components as -v variables and those of env as
// BATON_PG_*_PASSWORD variables, and returns what psql printed.
func (d *deployment) rolesSQL(t *testing.T, vars, env []string) (string, error) {
	t.Helper()
	bin, err := pgcluster.FindBinDir()
	require.NoError(t, err)
	args := []string{"-X", "-d", d.server.URL("postgres"), "-v", "database=" + d.name}
	for _, c := range vars {
		args = append(args, "-v", c+"_password="+passwords[c])
	}
	args = append(args, "-f", "roles.sql")
	cmd := exec.Command(filepath.Join(bin, "psql"), args...)
	cmd.Env = os.Environ()
	for _, c := range env {
		cmd.Env = append(cmd.Env, "BATON_PG_"+strings.ToUpper(c)+"_PASSWORD="+passwords[c])
	}
	out, err := cmd.CombinedOutput()
	for c, pw := range passwords {
		require.NotContains(t, string(out), pw, "roles.sql printed the password of baton_%s", c)
	}
	return string(out), err
}

// url is the URL a component connects with: its role and password, over
// TLS with the server's certificate checked.
func (d *deployment) url(component string) string {
	return d.server.TLSURL("baton_"+component, passwords[component], d.name)
}

// pool connects as a component's role.
func (d *deployment) pool(t *testing.T, component string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), d.url(component))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	require.NoError(t, p.Ping(context.Background()), "baton_%s connects", component)
	return p
}

// superuser connects to the database as postgres.
func (d *deployment) superuser(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), d.server.URL(d.name))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
