// Package clustertest starts Baton's NATS cluster (deploy/nats) in the
// test's process, from the shipped configuration files, with throwaway
// certificates from make-certs.sh and nkeys from make-nkeys: three
// JetStream nodes with TLS on clients and routes and one nkey user per
// component. Tests of any package use it to run Baton's components, as
// processes or in-process clients, against the cluster as an operator
// deploys it.
//
// It is a package of its own, not part of natsdeploy, so that make-nkeys,
// which operators run, does not carry a NATS server and the testing
// package.
package clustertest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
	"github.com/batonhq/baton/internal/natsconn"
)

// Nodes are the node files of the cluster, as shipped.
var Nodes = []string{"node-1.conf", "node-2.conf", "node-3.conf"}

// ShippedDir returns the folder of the shipped configuration files,
// deploy/nats of this source tree.
func ShippedDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Options configure Start.
type Options struct {
	// ConfDir is the folder whose node files (Nodes, with the files they
	// include) are started. Defaults to ShippedDir(): the files as
	// shipped. A test that changes a file starts a copy.
	ConfDir string
}

// Cluster is a running three-node cluster. It stops when the test that
// started it ends.
type Cluster struct {
	// Servers are the nodes, n1 to n3.
	Servers []*server.Server
	// URLs lists the nodes' client URLs as the servers report them,
	// comma-separated.
	URLs string
	// TLSURLs lists the same nodes as tls:// URLs, comma-separated: what
	// an operator gives a component in BATON_NATS_URL.
	TLSURLs string
	// Certs is the folder make-certs.sh wrote: ca.pem, n1.pem … and
	// client.pem with their keys.
	Certs string
	// Keys is the folder make-nkeys wrote: a seed file per user
	// (natsdeploy.SeedFile) and natsdeploy.EnvFile.
	Keys string
}

// CAFile is the CA that signed the nodes' certificates, for a
// component's BATON_NATS_TLS_CA.
func (c *Cluster) CAFile() string { return filepath.Join(c.Certs, "ca.pem") }

// SeedFile is the nkey seed file of user (relay, worker, api,
// group-audit, group-webhook, replay, status, console, sys), for a component's
// BATON_NATS_NKEY_SEED.
func (c *Cluster) SeedFile(user string) string {
	return filepath.Join(c.Keys, natsdeploy.SeedFile(user))
}

// Options returns the connection settings of user as its component takes
// them from BATON_NATS_* variables: every node, the user's seed, the CA
// and the user's inbox prefix.
func (c *Cluster) Options(user string) natsconn.Options {
	o := natsconn.Options{
		URL:          c.URLs,
		Name:         "baton " + user,
		NKeySeedFile: c.SeedFile(user),
		TLSCAFile:    c.CAFile(),
	}
	for _, u := range natsdeploy.Users {
		if u.Name == user {
			o.InboxPrefix = u.InboxPrefix
		}
	}
	return o
}

// envMu serializes the parsing of configuration files: the server reads
// certificate paths and public keys from the process environment, which
// differs per node and per cluster.
var envMu sync.Mutex

// Start starts the cluster of opts.ConfDir's node files in this process.
// The files are read by nats-server's own parser, unchanged, with their
// variables (certificates, store folder, public keys) set as
// nats-server.env and nkeys.env set them on a node; only what cannot be
// the same for three nodes on one machine is replaced after parsing:
// listen ports (the shipped 4222, 6222, 8222) and the routes (the shipped
// n1.internal… names become this machine's route ports). Everything else
// (TLS on clients and routes, accounts, users, permissions) is as shipped.
// It returns once JetStream has a meta leader that every node follows, and
// stops the nodes when t ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	confDir := opts.ConfDir
	if confDir == "" {
		confDir = ShippedDir()
	}
	c := &Cluster{Certs: t.TempDir(), Keys: filepath.Join(t.TempDir(), "nkeys")}
	MakeCerts(t, c.Certs, "n1", "n2", "n3")
	if err := natsdeploy.WriteNKeys(c.Keys); err != nil {
		t.Fatalf("clustertest: make the nkeys: %v", err)
	}
	env := ReadEnvFile(t, filepath.Join(c.Keys, natsdeploy.EnvFile))

	routePorts := make([]int, len(Nodes))
	var routes []string
	for i := range Nodes {
		routePorts[i] = freePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
	}
	var nodeOpts []*server.Options
	for i, node := range Nodes {
		name := fmt.Sprintf("n%d", i+1)
		nodeEnv := map[string]string{
			"BATON_NATS_SERVER_CERT": filepath.Join(c.Certs, name+".pem"),
			"BATON_NATS_SERVER_KEY":  filepath.Join(c.Certs, name+"-key.pem"),
			"BATON_NATS_SERVER_CA":   c.CAFile(),
			"BATON_NATS_STORE_DIR":   t.TempDir(),
		}
		for k, v := range env {
			nodeEnv[k] = v
		}
		o, err := ProcessConfigFile(filepath.Join(confDir, node), nodeEnv)
		if err != nil {
			t.Fatalf("clustertest: nats-server should accept %s: %v", node, err)
		}
		if o.ServerName != name {
			t.Fatalf("clustertest: %s names its node %q, want %q", node, o.ServerName, name)
		}
		o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
		o.HTTPPort = server.RANDOM_PORT
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", routePorts[i]
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		o.NoLog, o.NoSigs = true, true
		nodeOpts = append(nodeOpts, o)
	}
	for _, o := range nodeOpts {
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("clustertest: configure node %s: %v", o.ServerName, err)
		}
		c.Servers = append(c.Servers, s)
		go s.Start()
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			s.Shutdown()
		}
		for _, s := range c.Servers {
			s.WaitForShutdown()
		}
	})
	var urls, tlsURLs []string
	for _, s := range c.Servers {
		// A deadline, not a wait: it returns as soon as the node listens.
		// On a loaded machine a node has been seen to take over 20 s.
		if !s.ReadyForConnections(60 * time.Second) {
			t.Fatalf("clustertest: node %s did not accept clients within 60s", s.Name())
		}
		urls = append(urls, s.ClientURL())
		tlsURLs = append(tlsURLs, "tls://"+s.Addr().String())
	}
	c.URLs = strings.Join(urls, ",")
	c.TLSURLs = strings.Join(tlsURLs, ",")
	c.waitForMetaLeader(t)
	return c
}

// waitForMetaLeader waits until one node leads JetStream's meta group,
// every node follows it and the leader knows every node's state: the point
// from which a stream with three replicas can be placed. The server offers
// no notification of this, so it is polled, with a deadline.
func (c *Cluster) waitForMetaLeader(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		leader, current, peers := 0, 0, 0
		for _, s := range c.Servers {
			if s.JetStreamIsLeader() {
				leader++
				// Peers whose state the leader has heard: a stream's
				// replicas can be placed on these only.
				peers = len(s.JetStreamClusterPeers())
			}
			if s.JetStreamIsCurrent() && s.NumRoutes() >= len(c.Servers)-1 {
				current++
			}
		}
		if leader == 1 && current == len(c.Servers) && peers == len(c.Servers) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("clustertest: the cluster has no JetStream meta leader that all %d nodes follow after 20s (leaders %d, current %d, peers known to the leader %d)", len(c.Servers), leader, current, peers)
		}
		<-tick.C
	}
}

// ProcessConfigFile runs server.ProcessConfigFile with exactly the
// variables of env set, and puts the environment back before it returns.
func ProcessConfigFile(file string, env map[string]string) (*server.Options, error) {
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

// MakeCerts runs the shipped make-certs.sh into dir.
func MakeCerts(t testing.TB, dir string, nodes ...string) {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("clustertest: make-certs.sh needs openssl, which this machine lacks: apt-get install openssl")
	}
	cmd := exec.Command("bash", append([]string{filepath.Join(ShippedDir(), "make-certs.sh"), dir}, nodes...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clustertest: make-certs.sh failed: %v\n%s", err, out)
	}
}

// ReadEnvFile reads KEY=VALUE lines, as systemd's EnvironmentFile does.
func ReadEnvFile(t testing.TB, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("clustertest: %s: line %q is not KEY=VALUE", path, line)
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("clustertest: read %s: %v", path, err)
	}
	return env
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("clustertest: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
