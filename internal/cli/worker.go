package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/config"
	batonnats "github.com/batonhq/baton/nats"
)

type workerCmd struct {
	config.Database `embed:""`
	config.NATS     `embed:""`
	config.Stream   `embed:""`

	Consumer          string          `name:"consumer" env:"BATON_CONSUMER" setting:"Consumer.Name" help:"Durable JetStream consumer shared by every worker of the group. Defaults to ${consumer}."`
	Agent             string          `name:"agent" env:"BATON_AGENT" default:"echo" enum:"echo,openai" help:"Agent that answers turns: echo (replies echo: <content>; obeys /sleep, /fail and /tool lines with --echo-directives), or openai (a model server speaking the OpenAI chat completions API)."`
	Debounce          time.Duration   `name:"debounce" env:"BATON_DEBOUNCE" default:"${debounce}" setting:"Debounce" help:"Quiet window of a burst: a turn starts at once, and a message that arrives within this long of the previous one supersedes the turn (unless it started a write), so a burst gets one reply. 0 turns it off."`
	MaxAttempts       int             `name:"max-attempts" env:"BATON_MAX_ATTEMPTS" setting:"MaxAttempts" help:"Attempts at a turn before a visible error ends it. Defaults to ${max_attempts}."`
	Lease             time.Duration   `name:"lease" env:"BATON_LEASE" setting:"Lease" help:"How long a claim owns its conversation without renewal; a running turn renews it every third of it. Defaults to ${lease}."`
	AckWait           time.Duration   `name:"ack-wait" env:"BATON_ACK_WAIT" setting:"Consumer.AckWait" help:"How long JetStream waits for an ack or progress signal before redelivering a trigger. Defaults to the lease."`
	MaxDeliver        int             `name:"max-deliver" env:"BATON_MAX_DELIVER" setting:"Consumer.MaxDeliver" help:"Deliveries of one trigger before JetStream drops it; -1 is unlimited (attempts are capped in PostgreSQL). Defaults to ${max_deliver}."`
	BackOff           []time.Duration `name:"backoff" env:"BATON_BACKOFF" sep:"," setting:"Consumer.BackOff" help:"Ack waits of successive redeliveries, such as 30s,1m,5m; the first must equal the ack wait. Defaults to none (the ack wait every time)."`
	Concurrency       int             `name:"concurrency" env:"BATON_CONCURRENCY" setting:"Concurrency" help:"Turns this worker runs at once. Defaults to ${concurrency}."`
	MaxTurnMessages   int             `name:"max-turn-messages" env:"BATON_MAX_TURN_MESSAGES" setting:"MaxTurnMessages" help:"Pending messages one turn answers at most, oldest first; the rest are the next turns'. Defaults to ${max_turn_messages}."`
	MaxToolIterations int             `name:"max-tool-iterations" env:"BATON_MAX_TOOL_ITERATIONS" setting:"MaxToolIterations" help:"Steps of a turn that may ask for tools, whatever the agent; an agent still asking after them ends the turn with a visible error. Defaults to ${max_tool_iterations}."`
	TurnTimeout       time.Duration   `name:"turn-timeout" env:"BATON_TURN_TIMEOUT" setting:"TurnTimeout" help:"Wall-clock deadline of a turn; past it the attempt fails and is retried, then shown as failed. Defaults to ${turn_timeout}."`
	SessionCheck      time.Duration   `name:"session-check-interval" env:"BATON_SESSION_CHECK_INTERVAL" setting:"SessionCheckInterval" help:"How often this worker looks for runs of workers whose database session ended, and recovers them. Defaults to ${session_check}."`
	Session           bool            `name:"session" env:"BATON_SESSION" default:"true" negatable:"" help:"Hold a database session that tells other workers this one is alive, so that the turns of a worker that dies are taken over at once instead of after the lease; --no-session behind a pooler in transaction mode, which cannot keep a session."`
	MetricsAddr       string          `name:"metrics-addr" env:"BATON_METRICS_ADDR" default:"" help:"Address to serve Prometheus metrics on /metrics, such as 127.0.0.1:9091. Default: not served."`
	modelFlags        `embed:""`
	echoFlags         `embed:""`
	mcpFlags          `embed:""`
}

// echoFlags configure --agent echo.
type echoFlags struct {
	EchoDirectives bool `name:"echo-directives" env:"BATON_ECHO_DIRECTIVES" help:"Make the echo agent obey /sleep, /fail and /tool lines, for development and tests; off, they are echoed as text. Never on a worker that strangers can reach through the API."`
}

// modelFlags configure --agent openai.
type modelFlags struct {
	ModelBaseURL     string        `name:"model-base-url" env:"BATON_MODEL_BASE_URL" setting:"BaseURL" help:"API root of the OpenAI-compatible model server, such as http://127.0.0.1:11434/v1. Defaults to ${model_base_url}."`
	ModelAPIKey      string        `name:"model-api-key" env:"BATON_MODEL_API_KEY" help:"API key sent as a bearer token; local servers often need none."`
	Model            string        `name:"model" env:"BATON_MODEL" setting:"Model" help:"Model name the server knows; required with --agent openai."`
	ModelTimeout     time.Duration `name:"model-timeout" env:"BATON_MODEL_TIMEOUT" setting:"RequestTimeout" help:"Cap of one model call, to the last streamed chunk, however steadily it streams; past it the attempt fails and is retried. Defaults to ${model_timeout}."`
	ModelFirstByte   time.Duration `name:"model-first-byte-timeout" env:"BATON_MODEL_FIRST_BYTE_TIMEOUT" setting:"FirstByteTimeout" help:"Longest wait for the first chunk of a model's answer (the whole answer without streaming); past it the attempt fails and is retried. Defaults to ${model_first_byte}."`
	ModelIdle        time.Duration `name:"model-idle-timeout" env:"BATON_MODEL_IDLE_TIMEOUT" setting:"IdleTimeout" help:"Longest pause in a streamed answer; past it the attempt fails and is retried. Defaults to ${model_idle}."`
	ModelStreaming   bool          `name:"model-streaming" env:"BATON_MODEL_STREAMING" default:"true" negatable:"" help:"Stream model answers, so replies show as they are written; --model-streaming=false for servers that cannot stream."`
	ModelContext     int           `name:"model-context-tokens" env:"BATON_MODEL_CONTEXT_TOKENS" setting:"ContextTokens" help:"Budget of one model request in estimated tokens (a token per 3 bytes): system prompt, tools, the turn and as much history as fits. Set it to the model's context window less room for the answer. Defaults to ${model_context}."`
	ModelToolResult  int           `name:"model-max-tool-result-bytes" env:"BATON_MODEL_MAX_TOOL_RESULT_BYTES" setting:"MaxToolResultBytes" help:"Longest tool result the model reads; a longer one keeps its start and end. Defaults to ${model_tool_result}."`
	MaxModelCalls    int           `name:"max-model-calls" env:"BATON_MAX_MODEL_CALLS" setting:"MaxModelCalls" help:"Model calls one turn may make, retries included. Defaults to ${max_model_calls}."`
	SystemPrompt     string        `name:"system-prompt" env:"BATON_SYSTEM_PROMPT" help:"First message of every model request."`
	ToolHTTPGetAllow []string      `name:"tool-http-get-allow" env:"BATON_TOOL_HTTP_GET_ALLOW" sep:"," help:"Hosts the http_get tool may read; none leaves the tool out."`
	ToolWebhookURL   string        `name:"tool-webhook-url" env:"BATON_TOOL_WEBHOOK_URL" help:"URL the webhook (write) tool posts to; none leaves the tool out."`
}

func (c *workerCmd) Run(ctx context.Context, env *Env) error {
	if err := c.NATS.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if err := c.Stream.Check(); err != nil {
		return settingError(c, err)
	}
	log := env.Log.With().Str("component", "worker").Logger()
	defer startTracing(ctx, "worker", log)()
	debounce := c.Debounce
	if debounce == 0 {
		debounce = consumer.NoDebounce
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := consumer.Config{
		Stream: c.StreamConfig(),
		Consumer: batonnats.ConsumerConfig{
			Name:        c.Consumer,
			Description: "Baton turn runner",
			AckWait:     c.AckWait,
			MaxDeliver:  c.MaxDeliver,
			BackOff:     c.BackOff,
		},
		Agent:             consumer.Echo{Directives: c.EchoDirectives},
		Debounce:          debounce,
		MaxAttempts:       c.MaxAttempts,
		Lease:             c.Lease,
		Concurrency:       c.Concurrency,
		MaxTurnMessages:   c.MaxTurnMessages,
		MaxToolIterations: c.MaxToolIterations,
		TurnTimeout:       c.TurnTimeout,
		Logger:            &log,
		Registerer:        reg,
		ApprovalTTL:       c.ApprovalTTL,
	}
	var mcpCfg *agent.MCPConfig
	if c.mcpFlags.any() {
		if c.Agent != "openai" && !c.EchoDirectives {
			return &UsageError{Err: fmt.Errorf("--mcp-server and --mcp-command need --agent openai, or the echo agent with --echo-directives (its /tool NAME__TOOL lines call them): without directives the echo agent calls no tools")}
		}
		mc, err := c.mcpFlags.config(env.Log.With().Str("component", "mcp").Logger(), reg)
		if err != nil {
			return &UsageError{Err: err}
		}
		if err := mc.WithDefaults().Validate(); err != nil {
			return settingError(c, err)
		}
		mcpCfg = &mc
	}
	cfg.SessionCheckInterval = c.SessionCheck
	if !c.Session {
		cfg.SessionCheckInterval = consumer.NoSession
	}
	var agentCfg *agent.Config
	if c.Agent == "openai" {
		tools, err := agent.Builtins{HTTPGetAllow: c.ToolHTTPGetAllow, WebhookURL: c.ToolWebhookURL}.Registry()
		if err != nil {
			return &UsageError{Err: err}
		}
		alog := env.Log.With().Str("component", "agent").Logger()
		ac := agent.Config{
			BaseURL: c.ModelBaseURL, APIKey: c.ModelAPIKey, Model: c.Model, SystemPrompt: c.SystemPrompt,
			RequestTimeout: c.ModelTimeout, FirstByteTimeout: c.ModelFirstByte, IdleTimeout: c.ModelIdle,
			DisableStreaming: !c.ModelStreaming, ContextTokens: c.ModelContext, MaxToolResultBytes: c.ModelToolResult,
			MaxModelCalls: c.MaxModelCalls, Logger: &alog,
		}
		if err := ac.WithDefaults().Validate(); err != nil {
			return settingError(c, err)
		}
		if err := ac.WithDefaults().CheckTools(tools.Specs()); err != nil {
			return settingError(c, err)
		}
		agentCfg = &ac
		cfg.Tools = tools.Tools()
	}
	// Checked before connecting, so a wrong flag fails at once with its
	// name.
	if err := cfg.WithDefaults().Validate(); err != nil {
		return settingError(c, err)
	}

	pool, err := openServicePool(ctx, c.Database, workerPoolConns(cfg.WithDefaults().Concurrency), log)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := connectJetStream(c.NATS.Options("worker"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	registerNATSConnected(reg, nc)
	// The relay owns the outbox stream and the API the events stream: a
	// worker reads the one as it is and only publishes to the other.
	if cfg.Stream, err = joinStream(ctx, js, c.StreamConfig(), log); err != nil {
		return settingError(c, err)
	}
	events, err := consumer.NewEventPublisher(consumer.EventPublisherConfig{Logger: &log}, js)
	if err != nil {
		return err
	}
	cfg.OnConversationEvent = events.Publish
	if agentCfg != nil {
		a, err := agent.NewOpenAI(*agentCfg)
		if err != nil {
			return &UsageError{Err: err}
		}
		cfg.Agent = a
	}
	if mcpCfg != nil {
		m, err := agent.NewMCP(*mcpCfg, pool)
		if err != nil {
			return settingError(c, err)
		}
		defer m.Close()
		cfg.ToolSource = m
	}
	w, err := consumer.New(cfg, pool, js)
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
	err = w.Run(ctx)
	events.Stop()
	return err
}

// workerPoolConns is the size of a worker's database pool when its URL
// names none: a connection for each of up to 16 turns at once. A turn holds
// a connection only for its claim, its finalize and its tool calls' journal,
// never across a model call, so 16 keep a fast agent from queueing for a
// connection (pgx's default, 4 on a 2-core machine, halved the echo agent's
// turn rate) while three workers stay well inside PostgreSQL's default 100
// connections. pool_max_conns in the URL overrides it.
func workerPoolConns(concurrency int) int32 {
	return int32(min(concurrency, 16))
}
