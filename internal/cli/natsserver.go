package cli

import (
	"context"
	"fmt"
	"strings"

	batonnats "github.com/batonhq/baton/nats"
)

// natsServerCmd runs the embedded NATS server as a process of its own: a
// node of a local JetStream cluster for fault tests and for trying
// replicas on one machine. Production should run nats-server itself (see
// deploy/nats).
type natsServerCmd struct {
	Host        string   `name:"host" help:"Address to listen on." default:"127.0.0.1"`
	Port        int      `name:"port" help:"Client port." default:"4222"`
	StoreDir    string   `name:"store-dir" required:"" help:"JetStream store folder." type:"path"`
	Name        string   `name:"name" help:"Server name (required in a cluster)."`
	ClusterName string   `name:"cluster" help:"Cluster name; with --cluster-port and --routes forms a JetStream cluster."`
	ClusterPort int      `name:"cluster-port" help:"Route port for other nodes."`
	Routes      []string `name:"routes" help:"Route URLs of every node (nats://host:port), comma-separated." sep:","`
}

func (c *natsServerCmd) Run(ctx context.Context, env *Env) error {
	if c.ClusterName != "" && (c.Name == "" || c.ClusterPort == 0 || len(c.Routes) == 0) {
		return &UsageError{Err: fmt.Errorf("a cluster node needs --name, --cluster-port and --routes")}
	}
	s, err := batonnats.StartEmbedded(batonnats.EmbeddedOptions{
		Host: c.Host, Port: c.Port, StoreDir: c.StoreDir, ServerName: c.Name,
		ClusterName: c.ClusterName, ClusterPort: c.ClusterPort, Routes: c.Routes,
	})
	if err != nil {
		return err
	}
	log := env.Log.With().Str("component", "nats").Logger()
	log.Info().Str("url", s.ClientURL()).Str("name", c.Name).Str("routes", strings.Join(c.Routes, ",")).Msg("NATS server ready")
	<-ctx.Done()
	s.Stop()
	return nil
}
