package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
)

type workerCmd struct {
	config.Database `embed:""`
	config.NATS     `embed:""`
	config.Stream   `embed:""`

	Consumer          string          `name:"consumer" env:"BATON_CONSUMER" setting:"Consumer.Name" help:"Durable JetStream consumer shared by every worker of the group. Defaults to ${consumer}."`
	Agent             string          `name:"agent" env:"BATON_AGENT" default:"echo" enum:"echo,openai,ag-ui,ai-sdk,a2a" help:"Agent that answers turns: echo (replies echo: <content>; obeys /sleep, /fail and /tool lines with --echo-directives), openai (a model server speaking the OpenAI chat completions API), ag-ui (an agent served over AG-UI at --agent-url), ai-sdk (an AI SDK chat route at --agent-url), or a2a (an opaque agent speaking A2A 1.0 over JSON-RPC at --agent-url, which runs its own tools outside Baton's journal; one task per turn). Baton drives the loop: an agent answers one step at a time and never runs Baton's tools itself."`
	Debounce          time.Duration   `name:"debounce" env:"BATON_DEBOUNCE" default:"${debounce}" setting:"Debounce" help:"Quiet window of a burst: a turn starts at once, and a message that arrives within this long of the previous one supersedes the turn (unless it started a write), so a burst gets one reply. 0 turns it off. It applies to conversations whose double texting is debounce (the API's --double-texting)."`
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
	externalFlags     `embed:""`
	echoFlags         `embed:""`
	mcpFlags          `embed:""`
}

// echoFlags configure --agent echo.
type echoFlags struct {
	EchoDirectives bool `name:"echo-directives" env:"BATON_ECHO_DIRECTIVES" help:"Make the echo agent obey /sleep, /fail and /tool lines, for development and tests; off, they are echoed as text. Never on a worker that strangers can reach through the API."`
}

// externalFlags configure --agent ag-ui, ai-sdk and a2a: an agent in any
// language, served over HTTP.
type externalFlags struct {
	FilesURL          string            `name:"files-url" env:"BATON_FILES_URL" setting:"FilesURL" help:"The API's URL as the agent reaches it, such as https://baton.example: a message's files go to the agent as file parts whose url is a link to GET /v1/files/{sha256} there, signed, working without a token for 30 minutes. Default: none, the agent gets no links and a note that files were left out."`
	AgentURL          string            `name:"agent-url" env:"BATON_AGENT_URL" setting:"URL" help:"URL Baton posts each step to, such as https://agent.example.com/api/agent (for a2a, the agent's JSON-RPC endpoint); required with --agent ag-ui, ai-sdk or a2a. Never logged."`
	AgentTimeout      time.Duration     `name:"agent-timeout" env:"BATON_AGENT_TIMEOUT" setting:"Timeout" help:"Cap of one step request, to the end of its stream; past it the step is retried. Defaults to ${agent_timeout}."`
	AgentFirstByte    time.Duration     `name:"agent-first-byte-timeout" env:"BATON_AGENT_FIRST_BYTE_TIMEOUT" setting:"FirstByteTimeout" help:"Longest wait for the first byte of an agent's answer; past it the step is retried. Defaults to ${agent_first_byte}."`
	AgentIdle         time.Duration     `name:"agent-idle-timeout" env:"BATON_AGENT_IDLE_TIMEOUT" setting:"IdleTimeout" help:"Longest pause in an agent's stream; past it the step is retried. Defaults to ${agent_idle}."`
	AgentHeaders      map[string]string `name:"agent-header" env:"BATON_AGENT_HEADER" setting:"Headers" help:"Header sent with every step request, NAME=VALUE (repeatable), such as an API key the agent expects. Values are never logged; take them from files with --agent-header-file."`
	AgentHeaderFiles  map[string]string `name:"agent-header-file" env:"BATON_AGENT_HEADER_FILE" help:"Header sent with every step request whose value is read from a file at start, NAME=FILE (repeatable)."`
	AgentTLSCA        string            `name:"agent-tls-ca" env:"BATON_AGENT_TLS_CA" setting:"TLSCAFile" help:"PEM file of the CA that signed an https agent's certificate, beside the system's."`
	AgentMaxInFlight  int               `name:"agent-max-in-flight" env:"BATON_AGENT_MAX_IN_FLIGHT" setting:"MaxInFlight" help:"Step requests in flight to the agent at once; more wait for a place. Defaults to ${agent_max_in_flight}."`
	AgentMaxStepBytes int64             `name:"agent-max-step-bytes" env:"BATON_AGENT_MAX_STEP_BYTES" setting:"MaxStepBytes" help:"Bytes of one step's answer read at most; a larger answer fails the turn visibly. Defaults to ${agent_max_step_bytes}."`
	AgentMaxToolCalls int               `name:"agent-max-tool-calls" env:"BATON_AGENT_MAX_TOOL_CALLS" setting:"MaxToolCalls" help:"Tool calls one step may ask for; more fail the turn visibly. Defaults to ${agent_max_tool_calls}."`
	AgentThreadID     string            `name:"agent-thread-id" env:"BATON_AGENT_THREAD_ID" setting:"ThreadID" enum:"key,uuid" default:"key" help:"Thread id of the step requests (an A2A agent's contextId): key (the conversation's server key) or uuid (a UUIDv5 of it, for agents such as LangGraph's that want UUIDs)."`
	AgentAudience     string            `name:"agent-audience" env:"BATON_AGENT_AUDIENCE" setting:"Audience" help:"Audience (aud) of the tokens Baton signs for the agent. Defaults to the origin of --agent-url."`
	AgentIssuer       string            `name:"agent-issuer" env:"BATON_AGENT_ISSUER" help:"Issuer (iss) of the tokens Baton signs for the agent. Defaults to ${agent_issuer}."`
	AgentSigningKey   string            `name:"agent-signing-key" env:"BATON_AGENT_SIGNING_KEY" help:"Ed25519 private key (PEM) that signs each step request's token, which the agent verifies against the API's /.well-known/jwks.json (serve the public key with baton api --agent-public-key); required with --agent ag-ui, ai-sdk or a2a. Make one with baton agent-key create."`
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
	ModelMedia       []string      `name:"model-media" env:"BATON_MODEL_MEDIA" sep:"," setting:"ModelMedia" placeholder:"TYPE" help:"Media types of files the model server reads, comma-separated (image/* for every image type): an image goes as an image_url part, anything else as a file part, the bytes in a data URL. A text file of a type not listed goes as text; any other file fails its turn with a visible error. Defaults to ${model_media}."`
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
		FilesURL:          c.FilesURL,
	}
	var mcpCfg *agent.MCPConfig
	if c.mcpFlags.any() {
		switch {
		case c.Agent == "echo" && !c.EchoDirectives:
			return &UsageError{Err: fmt.Errorf("--mcp-server and --mcp-command need an agent that calls tools (--agent openai, ag-ui or ai-sdk), or the echo agent with --echo-directives (its /tool NAME__TOOL lines call them): without directives the echo agent calls no tools")}
		case c.Agent == agent.ProtocolA2A:
			return &UsageError{Err: fmt.Errorf("--mcp-server and --mcp-command need an agent that calls Baton's tools (--agent openai, ag-ui or ai-sdk): an A2A agent runs its own tools, and Baton declares it none")}
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
	// An external agent's outcomes are taken from its first step, and
	// written once the pool exists (and never on a step's way).
	alog := env.Log.With().Str("component", "agent").Logger()
	endpoints, err := agent.NewEndpointRecorder(agent.EndpointRecorderConfig{Logger: &alog})
	if err != nil {
		return err
	}
	if cfg.Agent, cfg.Tools, err = c.agentOf(&alog, reg, endpoints.Observe); err != nil {
		return err
	}
	// Checked before connecting, so a wrong flag fails at once with its
	// name.
	if err := cfg.WithDefaults().Validate(); err != nil {
		return settingError(c, err)
	}

	pool, err := openServicePool(ctx, c.Database, workerPoolConns(cfg.WithDefaults().Concurrency), log, genericPlans)
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
	if _, external := cfg.Agent.(*agent.External); external {
		rctx, stopRecording := context.WithCancel(ctx)
		recorded := make(chan struct{})
		go func() {
			defer close(recorded)
			_ = endpoints.Run(rctx, pool)
		}()
		// Stopped before the pool closes: its last records go out first.
		defer func() {
			stopRecording()
			<-recorded
		}()
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

// genericPlans has the worker's sessions plan each statement once
// (plan_cache_mode force_generic_plan), unless the URL sets plan_cache_mode
// itself. The claim and the finalize are one statement each over arrays
// of turns, and PostgreSQL's choice between a plan for the parameters and
// a generic one prefers, for those, to plan them again at every call: 0.8
// to 1.3 ms of the server's processor time for each claim and each
// finalize, on every turn's path, where their generic plans bind in 0.1
// ms and run as fast (docs/internals/measured.md, the floor). The setting
// comes after the connection, not in its startup packet, which a pooler
// in between may refuse.
func genericPlans(cfg *pgxpool.Config) {
	if _, ok := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; ok {
		return
	}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
		return err
	}
}

// agentOf builds the worker's agent and the tools it may call (none for
// the echo agent, which calls its own), checking every setting before
// anything connects. An external agent's metrics go to reg, and the
// outcome of each of its step requests to onOutcome.
func (c *workerCmd) agentOf(alog *zerolog.Logger, reg prometheus.Registerer, onOutcome func(agent.EndpointOutcome)) (consumer.Agent, consumer.Tools, error) {
	if c.Agent == "echo" {
		return consumer.Echo{Directives: c.EchoDirectives}, nil, nil
	}
	tools, err := agent.Builtins{HTTPGetAllow: c.ToolHTTPGetAllow, WebhookURL: c.ToolWebhookURL}.Registry()
	if err != nil {
		return nil, nil, &UsageError{Err: err}
	}
	switch c.Agent {
	case agent.ProtocolA2A:
		// An opaque agent: it runs its own tools, and Baton declares it
		// none.
		a, err := c.external(alog, reg, onOutcome)
		return a, nil, err
	case agent.ProtocolAGUI, agent.ProtocolAISDK:
		a, err := c.external(alog, reg, onOutcome)
		return a, tools.Tools(), err
	}
	ac := agent.Config{
		BaseURL: c.ModelBaseURL, APIKey: c.ModelAPIKey, Model: c.Model, SystemPrompt: c.SystemPrompt,
		RequestTimeout: c.ModelTimeout, FirstByteTimeout: c.ModelFirstByte, IdleTimeout: c.ModelIdle,
		DisableStreaming: !c.ModelStreaming, ContextTokens: c.ModelContext, MaxToolResultBytes: c.ModelToolResult,
		MaxModelCalls: c.MaxModelCalls, ModelMedia: c.ModelMedia, Logger: alog,
	}
	if err := ac.WithDefaults().Validate(); err != nil {
		return nil, nil, settingError(c, err)
	}
	if err := ac.WithDefaults().CheckTools(tools.Specs()); err != nil {
		return nil, nil, settingError(c, err)
	}
	a, err := agent.NewOpenAI(ac)
	if err != nil {
		return nil, nil, &UsageError{Err: err}
	}
	return a, tools.Tools(), nil
}

// external builds an agent served over HTTP (--agent ag-ui, ai-sdk or
// a2a), whose every step request carries a token signed with the worker's
// key.
func (c *workerCmd) external(log *zerolog.Logger, reg prometheus.Registerer, onOutcome func(agent.EndpointOutcome)) (consumer.Agent, error) {
	switch {
	case c.AgentURL == "":
		return nil, &UsageError{Err: fmt.Errorf("--agent %s needs --agent-url (BATON_AGENT_URL): the URL Baton posts each step to", c.Agent)}
	case c.AgentSigningKey == "":
		return nil, &UsageError{Err: fmt.Errorf("--agent %s needs --agent-signing-key (BATON_AGENT_SIGNING_KEY): every step request carries a token signed with it, which the agent verifies; make a key with `baton agent-key create` and serve its public half with `baton api --agent-public-key`", c.Agent)}
	}
	headers, err := agentHeaders(c.AgentHeaders, c.AgentHeaderFiles)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	xc := agent.ExternalConfig{
		Protocol: c.Agent, URL: c.AgentURL, Timeout: c.AgentTimeout, FirstByteTimeout: c.AgentFirstByte, IdleTimeout: c.AgentIdle,
		Headers: headers, TLSCAFile: c.AgentTLSCA, MaxInFlight: c.AgentMaxInFlight, MaxStepBytes: c.AgentMaxStepBytes,
		MaxToolCalls: c.AgentMaxToolCalls, ThreadID: c.AgentThreadID, Audience: c.AgentAudience, Logger: log,
		Registerer: reg, OnOutcome: onOutcome,
	}.WithDefaults()
	if err := xc.Validate(); err != nil {
		return nil, settingError(c, err)
	}
	key, err := jwtauth.LoadSigningKey(c.AgentSigningKey)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--agent-signing-key: %w", err)}
	}
	xc.Authorizer = agent.StepSigner{Key: key, Issuer: c.AgentIssuer, Audience: xc.Audience}
	if c.Agent == agent.ProtocolA2A {
		a, err := agent.NewA2A(xc)
		if err != nil {
			return nil, settingError(c, err)
		}
		return a, nil
	}
	x, err := agent.NewExternal(xc)
	if err != nil {
		return nil, settingError(c, err)
	}
	return x, nil
}

// maxHeaderFile bounds a header value read from a file.
const maxHeaderFile = 16 << 10

// agentHeaders are the headers of --agent-header and those whose values
// --agent-header-file reads from files. A name given both ways is refused:
// one of them would be ignored.
func agentHeaders(values, files map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for name, value := range values {
		out[name] = value
	}
	for name, path := range files {
		if _, both := out[name]; both {
			return nil, fmt.Errorf("--agent-header and --agent-header-file both give header %s: keep one", name)
		}
		b, err := os.ReadFile(path)
		switch {
		case err != nil:
			return nil, fmt.Errorf("--agent-header-file %s: cannot read the file: %w", name, err)
		case len(b) > maxHeaderFile:
			return nil, fmt.Errorf("--agent-header-file %s: the file holds more than %d bytes, more than a header value", name, maxHeaderFile)
		}
		out[name] = strings.TrimRight(string(b), "\r\n")
	}
	return out, nil
}
