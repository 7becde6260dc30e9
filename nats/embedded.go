package nats

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedOptions configure an in-process NATS server with JetStream, used
// by `baton dev`, `baton nats-server` and the tests.
type EmbeddedOptions struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port for clients. Zero picks a free port.
	Port int
	// StoreDir is where JetStream keeps its data. Required.
	StoreDir string
	// ServerName names the node; required in a cluster.
	ServerName string
	// ClusterName, ClusterPort and Routes form a JetStream cluster when set.
	ClusterName string
	ClusterPort int
	Routes      []string
	// SyncAlways fsyncs every write (JetStream's default is lazy fsync).
	SyncAlways bool
}

// Embedded is a running in-process NATS server.
type Embedded struct {
	*server.Server
}

// StartEmbedded starts a NATS server with JetStream and waits until it
// accepts clients.
func StartEmbedded(o EmbeddedOptions) (*Embedded, error) {
	if o.StoreDir == "" {
		return nil, errors.New("nats: EmbeddedOptions.StoreDir is empty: give a folder for JetStream's data")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	} else if !portFree(o.Host, port) {
		return nil, fmt.Errorf("port %d on %s is busy: choose another port for the embedded NATS server", port, o.Host)
	}
	opts := &server.Options{
		ServerName: o.ServerName,
		Host:       o.Host,
		Port:       port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		SyncAlways: o.SyncAlways,
		// Clients of a dev or test server never need large payloads; keep
		// the server's defaults otherwise.
	}
	if o.ClusterName != "" {
		opts.Cluster.Name = o.ClusterName
		opts.Cluster.Host = o.Host
		opts.Cluster.Port = o.ClusterPort
		for _, r := range o.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("nats: route %q: %w", r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats: configure embedded server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats: embedded server did not become ready within 30s")
	}
	return &Embedded{Server: s}, nil
}

// Stop shuts the server down and waits for it.
func (e *Embedded) Stop() {
	e.Shutdown()
	e.WaitForShutdown()
}

func portFree(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
