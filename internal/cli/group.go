package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/config"
	batonnats "github.com/batonhq/baton/nats"
)

type groupCmd struct {
	Run         groupRunCmd    `cmd:"" help:"Run a built-in consumer group on the outbox stream: audit (append every event to audit_events) or webhook (POST every event, signed, to --webhook-url)."`
	DeadLetters deadLettersCmd `cmd:"" name:"dead-letters" help:"List, retry or discard the events a group parked in group_dead_letters."`
}

// builtinGroups are the groups this binary can run, by name.
var builtinGroups = map[string]bool{group.AuditGroup: true, group.WebhookGroup: true}

// groupFlags configure the built-in groups; `baton group run` and
// `baton replay` share them, so a replay handles events the way the group
// does.
type groupFlags struct {
	Lanes          int           `name:"lanes" env:"BATON_GROUP_LANES" setting:"Lanes" help:"Events this process handles at once; events of one conversation share a lane and keep their order. Defaults to ${group_lanes}."`
	MaxAttempts    int           `name:"max-attempts" env:"BATON_GROUP_MAX_ATTEMPTS" setting:"MaxAttempts" help:"Deliveries of a failing event before it is parked in group_dead_letters. Defaults to ${group_max_attempts}."`
	RetryMin       time.Duration `name:"retry-min" env:"BATON_GROUP_RETRY_MIN" setting:"RetryMin" help:"Delay before a failed event is delivered again; doubles with each attempt. Defaults to ${group_retry_min}."`
	RetryMax       time.Duration `name:"retry-max" env:"BATON_GROUP_RETRY_MAX" setting:"RetryMax" help:"Longest delay between attempts. Defaults to ${group_retry_max}."`
	AckWait        time.Duration `name:"ack-wait" env:"BATON_GROUP_ACK_WAIT" setting:"AckWait" help:"How long an event may go unsettled without a progress signal before JetStream hands it to another process. Defaults to ${group_ack_wait}."`
	WebhookURL     string        `name:"webhook-url" env:"BATON_WEBHOOK_URL" help:"URL the webhook group POSTs each event to."`
	WebhookSecret  string        `name:"webhook-secret" env:"BATON_WEBHOOK_SECRET" help:"Key of the Baton-Signature HMAC-SHA256 header; prefer the variable, which ps does not show."`
	WebhookTimeout time.Duration `name:"webhook-timeout" env:"BATON_WEBHOOK_TIMEOUT" default:"${webhook_timeout}" help:"Longest webhook request; past it the attempt fails and is retried."`
}

// config returns the group's configuration without connections, checked,
// or a usage error naming the flag.
func (f groupFlags) groupConfig(name string, stream batonnats.StreamConfig) (group.Config, error) {
	cfg := group.Config{
		Name: name, Stream: stream, Lanes: f.Lanes, MaxAttempts: f.MaxAttempts,
		RetryMin: f.RetryMin, RetryMax: f.RetryMax, AckWait: f.AckWait,
	}
	switch name {
	case group.AuditGroup:
		cfg.Handler = group.Audit
	case group.WebhookGroup:
		h, err := group.Webhook(group.WebhookConfig{URL: f.WebhookURL, Secret: f.WebhookSecret, Timeout: f.WebhookTimeout})
		if err != nil {
			return cfg, &UsageError{Err: err}
		}
		cfg.Handler = h
	default:
		return cfg, &UsageError{Err: fmt.Errorf("%q is not a built-in group: choose audit or webhook", name)}
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, settingError(f, err)
	}
	return cfg, nil
}

// newGroup builds the group over pool and js, with log.
func newGroup(cfg group.Config, pool *pgxpool.Pool, js jetstream.JetStream, log zerolog.Logger) (*group.Group, error) {
	cfg.Logger = &log
	return group.New(cfg, pool, js)
}

type groupRunCmd struct {
	config.Database `embed:""`
	config.NATS     `embed:""`
	config.Stream   `embed:""`

	Name        string `arg:"" enum:"audit,webhook" help:"Built-in group to run: audit or webhook."`
	MetricsAddr string `name:"metrics-addr" env:"BATON_METRICS_ADDR" placeholder:"HOST:PORT" help:"Serve Prometheus metrics on http://HOST:PORT/metrics when set."`
	groupFlags  `embed:""`
}

func (c *groupRunCmd) Run(ctx context.Context, env *Env) error {
	if err := c.NATS.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.Stream.Check(); err != nil {
		return settingError(c, err)
	}
	cfg, err := c.groupConfig(c.Name, c.StreamConfig())
	if err != nil {
		return err
	}
	log := env.Log.With().Str("component", "group").Logger()
	defer startTracing(ctx, "group", log)()
	pool, err := openServicePool(ctx, c.Database, 0, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := connectJetStream(c.NATS.Options(c.Name), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A group owns only its durable consumer; the stream is the relay's.
	if cfg.Stream, err = joinStream(ctx, js, c.StreamConfig(), log); err != nil {
		return settingError(c, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerNATSConnected(reg, nc)
	cfg.Registerer = reg
	g, err := newGroup(cfg, pool, js, log)
	if err != nil {
		return err
	}
	if c.MetricsAddr != "" {
		stop, err := serveMetrics(c.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return g.Run(ctx)
}
