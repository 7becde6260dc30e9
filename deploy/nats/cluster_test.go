package natsdeploy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
	"github.com/batonhq/baton/internal/natsconn"
)

// nodes are the node files of the cluster, as shipped.
var nodes = []string{"node-1.conf", "node-2.conf", "node-3.conf"}

// cluster is a three-node cluster started from the configuration files of
// a folder, with throwaway certificates and keys.
type cluster struct {
	servers []*server.Server
	// URLs lists the nodes' client URLs, comma-separated.
	URLs string
	// Certs holds make-certs.sh's output, Keys make-nkeys's.
	Certs, Keys string
}

// envMu serializes the parsing of configuration files: the server reads
// certificate paths and public keys from the process environment, which
// differs per node and per cluster.
var envMu sync.Mutex

// startCluster starts the cluster of confDir's node files in this process.
// The files are read by nats-server's own parser, unchanged; only what
// cannot be the same for three nodes on one machine is replaced after
// parsing: listen ports (the shipped 4222, 6222, 8222), the routes (the
// shipped n1.internal… names become this machine's route ports) and the
// store folders. Everything else (TLS on clients and routes, accounts,
// users, permissions) is as shipped. It returns once JetStream has a meta
// leader that every node follows.
func startCluster(t *testing.T, confDir string) *cluster {
	t.Helper()
	c := &cluster{Certs: t.TempDir(), Keys: filepath.Join(t.TempDir(), "nkeys")}
	makeCerts(t, c.Certs, "n1", "n2", "n3")
	require.NoError(t, natsdeploy.WriteNKeys(c.Keys))
	env := readEnvFile(t, filepath.Join(c.Keys, natsdeploy.EnvFile))

	routePorts := make([]int, len(nodes))
	var routes []string
	for i := range nodes {
		routePorts[i] = freePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
	}
	var opts []*server.Options
	for i, node := range nodes {
		name := fmt.Sprintf("n%d", i+1)
		nodeEnv := map[string]string{
			"BATON_NATS_SERVER_CERT": filepath.Join(c.Certs, name+".pem"),
			"BATON_NATS_SERVER_KEY":  filepath.Join(c.Certs, name+"-key.pem"),
			"BATON_NATS_SERVER_CA":   filepath.Join(c.Certs, "ca.pem"),
		}
		for k, v := range env {
			nodeEnv[k] = v
		}
		o := parseConfig(t, filepath.Join(confDir, node), nodeEnv)
		require.Equal(t, name, o.ServerName, "%s should name its node", node)
		o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
		o.HTTPPort = server.RANDOM_PORT
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", routePorts[i]
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		o.StoreDir = t.TempDir()
		o.NoLog, o.NoSigs = true, true
		opts = append(opts, o)
	}
	for _, o := range opts {
		s, err := server.NewServer(o)
		require.NoError(t, err)
		c.servers = append(c.servers, s)
		go s.Start()
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			s.Shutdown()
		}
		for _, s := range c.servers {
			s.WaitForShutdown()
		}
	})
	var urls []string
	for _, s := range c.servers {
		require.True(t, s.ReadyForConnections(20*time.Second), "node %s did not accept clients within 20s", s.Name())
		urls = append(urls, s.ClientURL())
	}
	c.URLs = strings.Join(urls, ",")
	c.waitForMetaLeader(t)
	return c
}

// waitForMetaLeader waits until one node leads JetStream's meta group,
// every node follows it and the leader knows every node's state: the point
// from which a stream with three replicas can be placed. The server offers no notification of this, so it is
// polled, with a deadline.
func (c *cluster) waitForMetaLeader(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		leader, current, peers := 0, 0, 0
		for _, s := range c.servers {
			if s.JetStreamIsLeader() {
				leader++
				// Peers whose state the leader has heard: a stream's
				// replicas can be placed on these only.
				peers = len(s.JetStreamClusterPeers())
			}
			if s.JetStreamIsCurrent() && s.NumRoutes() >= len(c.servers)-1 {
				current++
			}
		}
		if leader == 1 && current == len(c.servers) && peers == len(c.servers) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster has no JetStream meta leader that all %d nodes follow after 20s (leaders %d, current %d, peers known to the leader %d)", len(c.servers), leader, current, peers)
		}
		<-tick.C
	}
}

// parseConfig reads a node file with the server's parser, the variables of
// env set in the environment while it does.
func parseConfig(t *testing.T, file string, env map[string]string) *server.Options {
	t.Helper()
	o, err := processConfigFile(file, env)
	require.NoError(t, err, "nats-server should accept %s", file)
	return o
}

// processConfigFile runs server.ProcessConfigFile with exactly the
// variables of env set, and puts the environment back before it returns.
func processConfigFile(file string, env map[string]string) (*server.Options, error) {
	envMu.Lock()
	defer envMu.Unlock()
	for k, v := range env {
		old, had := os.LookupEnv(k)
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
		defer func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		}()
	}
	return server.ProcessConfigFile(file)
}

// makeCerts runs the shipped make-certs.sh.
func makeCerts(t *testing.T, dir string, nodes ...string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("make-certs.sh needs openssl, which this machine lacks: apt-get install openssl")
	}
	cmd := exec.Command("bash", append([]string{"make-certs.sh", dir}, nodes...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make-certs.sh failed:\n%s", out)
}

// readEnvFile reads KEY=VALUE lines, as systemd's EnvironmentFile does.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s: line %q is not KEY=VALUE", path, line)
		env[k] = v
	}
	require.NoError(t, sc.Err())
	return env
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// client is a component's connection, with the permission violations the
// server reported on it.
type client struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	violations chan error
}

// options are the connection settings of a component, as its process
// would take them from BATON_NATS_* variables.
func (c *cluster) options(user string) natsconn.Options {
	o := natsconn.Options{
		URL:          c.URLs,
		Name:         "baton " + user,
		NKeySeedFile: filepath.Join(c.Keys, natsdeploy.SeedFile(user)),
		TLSCAFile:    filepath.Join(c.Certs, "ca.pem"),
	}
	for _, u := range natsdeploy.Users {
		if u.Name == user {
			o.InboxPrefix = u.InboxPrefix
		}
	}
	return o
}

// connect connects as user through natsconn.Connect. The connection closes
// when t ends.
func (c *cluster) connect(t *testing.T, user string) *client {
	t.Helper()
	cl, err := c.dial(user)
	require.NoError(t, err)
	t.Cleanup(cl.nc.Close)
	return cl
}

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
