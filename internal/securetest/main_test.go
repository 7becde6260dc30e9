// Package securetest runs Baton as an operator deploys it against secured
// infrastructure: real `baton` processes, each with its own NATS user,
// against the three-node cluster of deploy/nats (TLS on clients and
// routes, least-privilege permissions), and against servers that take a
// password in the URL or a .creds file, with a PostgreSQL role that has a
// password. It checks that every component can do its job, that the
// cluster refuses a component that lacks its credentials or the CA with an
// error that says what to fix, and that no secret reaches any output.
package securetest

import (
	"os"
	"testing"

	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
