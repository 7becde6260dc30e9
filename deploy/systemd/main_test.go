// Package systemd_test is the deploy test: it deploys Baton from the
// files of deploy/ as the deploying guide (docs/guides/deploying.md) does, on this machine, and
// checks that it works. PostgreSQL runs with deploy/postgres's settings,
// a TLS certificate and the roles of roles.sql; the NATS cluster of
// deploy/nats runs its three nodes; and every unit of deploy/systemd runs
// as a real process with exactly the command, environment and
// credentials systemd would give it, only the hosts, paths and ports of
// the deployment's machines replaced by this machine's (the rewrite table
// of units_test.go). A message gets its reply from a model server, the
// groups get its event, every connection to PostgreSQL is over TLS, and no
// output holds a secret. Each test deploys a copy of the files; the tests
// that break one file see the deployment fail, saying what broke.
package systemd_test

import (
	"os"
	"testing"

	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
