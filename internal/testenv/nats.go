package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/pgcluster"
	batonnats "github.com/batonhq/baton/nats"
)

// NATS is a NATS server for one test.
type NATS struct {
	URL      string
	Embedded *batonnats.Embedded // nil when BATON_TEST_NATS_URL is used
	opts     batonnats.EmbeddedOptions
	t        testing.TB
}

// StartNATS starts an embedded NATS server with JetStream for t, with its
// own store folder and a random port, stopped when t ends. With
// BATON_TEST_NATS_URL set, that server is used instead.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	if u := os.Getenv("BATON_TEST_NATS_URL"); u != "" {
		return &NATS{URL: u, t: t}
	}
	return StartNATSOn(t, "")
}

// StartNATSOn is StartNATS on the address host (127.0.0.1 when empty),
// always embedded: for tests whose processes reach it from a network
// namespace of their own.
func StartNATSOn(t testing.TB, host string) *NATS {
	t.Helper()
	port, err := pgcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	n := &NATS{t: t, opts: batonnats.EmbeddedOptions{Host: host, StoreDir: t.TempDir(), Port: port}}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// ExampleNATS is StartNATS for an Example function, which has no
// testing.T: it returns the URL of an embedded server with JetStream (or
// BATON_TEST_NATS_URL), stopped once the package's tests have run (Main).
// A failure panics, which fails the example.
func ExampleNATS() string {
	if u := os.Getenv("BATON_TEST_NATS_URL"); u != "" {
		return u
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		panic("testenv: " + err.Error())
	}
	dir, err := os.MkdirTemp("", "baton-example-nats-")
	if err != nil {
		panic("testenv: " + err.Error())
	}
	s, err := batonnats.StartEmbedded(batonnats.EmbeddedOptions{StoreDir: dir, Port: port})
	if err != nil {
		panic(fmt.Sprintf("testenv: start NATS: %v", err))
	}
	AfterAll(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	return s.ClientURL()
}

// Start (re)starts the embedded server on its port and store.
func (n *NATS) Start() {
	n.t.Helper()
	if n.opts.StoreDir == "" {
		n.t.Skip("testenv: the NATS server given by BATON_TEST_NATS_URL cannot be restarted by a test")
	}
	s, err := batonnats.StartEmbedded(n.opts)
	if err != nil {
		n.t.Fatalf("testenv: start NATS: %v", err)
	}
	n.Embedded = s
	n.URL = s.ClientURL()
}

// Stop shuts the embedded server down; Start brings it back.
func (n *NATS) Stop() {
	if n.Embedded != nil {
		n.Embedded.Stop()
		n.Embedded = nil
	}
}

// Wipe stops the server, deletes everything it stored and starts it again
// empty on the same port, as an operator who lost the store would: clients
// reconnect to a server without the stream.
func (n *NATS) Wipe() {
	n.t.Helper()
	if n.opts.StoreDir == "" {
		n.t.Skip("testenv: the NATS server given by BATON_TEST_NATS_URL cannot be wiped by a test")
	}
	n.Stop()
	entries, err := os.ReadDir(n.opts.StoreDir)
	if err != nil {
		n.t.Fatalf("testenv: read the NATS store: %v", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(n.opts.StoreDir, e.Name())); err != nil {
			n.t.Fatalf("testenv: wipe the NATS store: %v", err)
		}
	}
	n.Start()
}

// Connect returns a client connection and its JetStream context, closed
// when the test ends.
func (n *NATS) Connect(t testing.TB) (*natsclient.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := natsclient.Connect(n.URL, natsclient.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("testenv: connect to NATS %s: %v", n.URL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// NATSCluster starts a JetStream cluster of size nodes in this process, for
// tests that need stream replicas. Nodes are stopped when t ends.
func NATSCluster(t testing.TB, size int) []*NATS {
	t.Helper()
	clientPorts := make([]int, size)
	routePorts := make([]int, size)
	for i := range size {
		var err error
		if clientPorts[i], err = pgcluster.FreePort(); err != nil {
			t.Fatal(err)
		}
		if routePorts[i], err = pgcluster.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	nodes := make([]*NATS, size)
	started := make(chan error, size)
	for i := range size {
		nodes[i] = &NATS{t: t, opts: batonnats.EmbeddedOptions{
			StoreDir:    t.TempDir(),
			Port:        clientPorts[i],
			ServerName:  fmt.Sprintf("n%d", i+1),
			ClusterName: "baton-test",
			ClusterPort: routePorts[i],
			Routes:      routes,
		}}
		go func(n *NATS) {
			s, err := batonnats.StartEmbedded(n.opts)
			if err == nil {
				n.Embedded = s
				n.URL = s.ClientURL()
			}
			started <- err
		}(nodes[i])
	}
	for range size {
		if err := <-started; err != nil {
			t.Fatalf("testenv: start NATS cluster node: %v", err)
		}
	}
	for _, n := range nodes {
		t.Cleanup(n.Stop)
	}
	return nodes
}
