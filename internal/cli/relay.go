package cli

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/relay"
)

type relayCmd struct {
	config.Database    `embed:""`
	config.NATS        `embed:""`
	config.Stream      `embed:""`
	config.Replication `embed:""`

	MaxInFlight          int           `name:"max-in-flight" env:"BATON_RELAY_MAX_IN_FLIGHT" setting:"MaxInFlight" help:"Events published and not yet acknowledged by JetStream, at most. Defaults to ${max_in_flight}."`
	StatusInterval       time.Duration `name:"status-interval" env:"BATON_RELAY_STATUS_INTERVAL" setting:"StatusInterval" help:"How often the confirmed position is reported to PostgreSQL; keep it below wal_sender_timeout. Defaults to ${status_interval}."`
	Heartbeat            time.Duration `name:"heartbeat" env:"BATON_RELAY_HEARTBEAT" setting:"HeartbeatInterval" help:"How often a heartbeat is written to the WAL, so an idle outbox does not pin WAL. Defaults to ${heartbeat}."`
	SweepInterval        time.Duration `name:"sweep-interval" env:"BATON_RELAY_SWEEP_INTERVAL" setting:"SweepInterval" help:"How often pending rows nobody claimed are announced again. Defaults to ${sweep_interval}."`
	SweepAge             time.Duration `name:"sweep-age" env:"BATON_RELAY_SWEEP_AGE" setting:"SweepAge" help:"How long a row stays pending after its insert or last announcement before the sweeper announces it again. Defaults to ${sweep_age}."`
	AckTimeout           time.Duration `name:"ack-timeout" env:"BATON_RELAY_ACK_TIMEOUT" setting:"AckTimeout" help:"How long to wait for JetStream to acknowledge an event before restarting from the slot. Defaults to ${ack_timeout}."`
	AllowRetentionShrink bool          `name:"allow-retention-shrink" env:"BATON_ALLOW_RETENTION_SHRINK" help:"Let the relay reduce the outbox stream's max age or replicas; without it, a reduction is refused at start (a shorter max age deletes older events at once)."`
	MetricsAddr          string        `name:"metrics-addr" env:"BATON_METRICS_ADDR" placeholder:"HOST:PORT" help:"Serve Prometheus metrics on http://HOST:PORT/metrics when set."`
	PruneEvery           time.Duration `name:"prune-every" env:"BATON_PRUNE_EVERY" default:"${prune_every}" help:"How often the relay that holds the slot deletes what retention allows (--outbox-retention and the rest); standby relays prune nothing. 0 turns pruning off."`
	retentionFlags       `embed:""`
}

func (c *relayCmd) Run(ctx context.Context, env *Env) error {
	log := env.Log.With().Str("component", "relay").Logger()
	defer startTracing(ctx, "relay", log)()
	relayGC()
	if err := c.NATS.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := relay.Config{
		Stream:               c.StreamConfig(),
		Slot:                 c.Slot,
		Publication:          c.Publication,
		MaxInFlight:          c.MaxInFlight,
		StatusInterval:       c.StatusInterval,
		HeartbeatInterval:    c.Heartbeat,
		SweepInterval:        c.SweepInterval,
		SweepAge:             c.SweepAge,
		AckTimeout:           c.AckTimeout,
		AllowRetentionShrink: c.AllowRetentionShrink,
		Registerer:           reg,
		Logger:               &log,
	}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return settingError(c, err)
	}
	retention, err := c.retention()
	if err != nil {
		return err
	}
	if c.PruneEvery < 0 {
		return &UsageError{Err: fmt.Errorf("--prune-every / BATON_PRUNE_EVERY %s: give a positive interval, such as %s, or 0 to turn pruning off", c.PruneEvery, DefaultPruneEvery)}
	}

	pool, err := openServicePool(ctx, c.Database, 0, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Publications are not buffered while the connection is down: they
	// fail at once, and the relay restarts from the slot when NATS is back.
	nc, err := connectNATS(c.NATS.Options("relay"), log,
		natsclient.RetryOnFailedConnect(true),
		natsclient.ReconnectWait(500*time.Millisecond),
		natsclient.ReconnectBufSize(-1),
	)
	if err != nil {
		return err
	}
	defer nc.Close()

	r, err := relay.New(cfg, pool, nc)
	if err != nil {
		return err
	}
	registerNATSConnected(reg, nc)
	var p *pruner
	if c.PruneEvery > 0 {
		if p, err = newPruner(pool, nc, cfg.Stream.Name, retention, c.PruneEvery, reg, env.Log); err != nil {
			return err
		}
	}

	if c.MetricsAddr != "" {
		stop, err := serveMetrics(c.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	log.Info().Str("slot", cfg.Slot).Str("publication", cfg.Publication).Str("stream", cfg.Stream.Name).Msg("relay starting")
	return runWithPruner(ctx, r.Run, r.Active, p)
}

// Garbage collection of the relay, unless GOGC or GOMEMLIMIT say otherwise.
const (
	relayGCPercent  = 400
	relayMemoryGoal = 40 << 20
)

// relayGC lets the relay's heap grow to five times what it holds before a
// collection (Go's default is twice), within a soft limit of 40 MiB: the
// relay allocates for every row it publishes and holds little, so most of
// its collections were wasted work on the path of every row.
func relayGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(relayGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(relayMemoryGoal)
	}
}
