package natsdeploy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/deploy/nats/clustertest"
	"github.com/batonhq/baton/internal/natsconn"
)

// nodes are the node files of the cluster, as shipped.
var nodes = clustertest.Nodes

// cluster is a three-node cluster started from the configuration files of
// a folder, with throwaway certificates and keys.
type cluster struct{ *clustertest.Cluster }

// startCluster starts the cluster of confDir's node files in this process
// (clustertest.Start).
func startCluster(t *testing.T, confDir string) *cluster {
	t.Helper()
	return &cluster{clustertest.Start(t, clustertest.Options{ConfDir: confDir})}
}

// parseConfig reads a node file with the server's parser, the variables of
// env set in the environment while it does.
func parseConfig(t *testing.T, file string, env map[string]string) *server.Options {
	t.Helper()
	o, err := processConfigFile(file, env)
	require.NoError(t, err, "nats-server should accept %s", file)
	return o
}

var (
	processConfigFile = clustertest.ProcessConfigFile
	makeCerts         = clustertest.MakeCerts
	readEnvFile       = clustertest.ReadEnvFile
)

// client is a component's connection, with the permission violations the
// server reported on it.
type client struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	violations chan error
}

// options are the connection settings of a component, as its process
// would take them from BATON_NATS_* variables.
func (c *cluster) options(user string) natsconn.Options { return c.Options(user) }

func (c *cluster) dial(user string) (*client, error) { return c.dialAt(user, c.URLs) }

// dialAt connects as user to the servers of urls only.
func (c *cluster) dialAt(user, urls string) (*client, error) {
	cl := &client{violations: make(chan error, 16)}
	o := c.options(user)
	o.URL = urls
	nc, err := natsconn.Connect(o, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case cl.violations <- err:
			default:
			}
		}
	}))
	if err != nil {
		return nil, err
	}
	cl.nc = nc
	if cl.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return cl, nil
}

// attempt runs op and reports the permission violation the server raised
// for it, if any, and op's own error. A refused JetStream API request
// gets no answer, so the violation, which the server reports at once,
// ends the wait instead of op's timeout. A refused publish or subscription
// does not fail the call at all: the server's report reaches the client
// before the answer to a PING sent after it, so a flush settles it.
func (cl *client) attempt(ctx context.Context, op func(ctx context.Context) error) (violation, err error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	select {
	case v := <-cl.violations:
		cancel()
		return v, <-done
	case err = <-done:
	}
	if ferr := cl.nc.FlushWithContext(ctx); ferr != nil {
		return nil, errors.Join(err, ferr)
	}
	if last := cl.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
		return last, err
	}
	select {
	case v := <-cl.violations:
		return v, err
	default:
	}
	return nil, err
}

// allowed runs op, which must succeed without a permission violation.
func (cl *client) allowed(ctx context.Context, what string, op func(ctx context.Context) error) error {
	v, err := cl.attempt(ctx, op)
	if v != nil {
		return fmt.Errorf("%s: refused by the server, want allowed: %w", what, v)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// refused runs op, which the server must refuse with a permission
// violation on the subject.
func (cl *client) refused(ctx context.Context, what, subject string, op func(ctx context.Context) error) error {
	v, err := cl.attempt(ctx, op)
	if v == nil {
		return fmt.Errorf("%s: allowed (op error: %v), want a permissions violation on %s", what, err, subject)
	}
	if !strings.Contains(v.Error(), subject) {
		return fmt.Errorf("%s: refused on another subject than %s: %w", what, subject, v)
	}
	return nil
}
