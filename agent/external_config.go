package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
)

// The protocols an external agent may speak.
const (
	// ProtocolAGUI is AG-UI 1.0: a RunAgentInput in, AG-UI events out.
	ProtocolAGUI = "ag-ui"
	// ProtocolAISDK is the AI SDK's chat route: what useChat posts in, a
	// UI message stream out.
	ProtocolAISDK = "ai-sdk"
	// ProtocolA2A is A2A 1.0 over JSON-RPC: an opaque agent that runs its
	// own tools, one task per step (see A2A).
	ProtocolA2A = "a2a"
)

// The ways of naming a conversation to an external agent (ThreadID).
const (
	// ThreadIDKey sends the conversation's server key as it is.
	ThreadIDKey = "key"
	// ThreadIDUUID sends a UUIDv5 of the server key in ThreadNamespace,
	// for agents that take UUIDs only (LangGraph).
	ThreadIDUUID = "uuid"
)

// ThreadNamespace is the namespace of the UUIDv5 thread ids of
// ThreadIDUUID: the thread of the conversation with server key k is
// UUIDv5(ThreadNamespace, k), which any language can compute again. It
// never changes.
var ThreadNamespace = uuid.MustParse("0e6fc094-4d5e-409d-a1ad-6d4d81500692")

// Defaults of an ExternalConfig. Its retry settings default to those of
// Config (DefaultMaxRetries and the others).
const (
	DefaultExternalTimeout          = 10 * time.Minute
	DefaultExternalFirstByteTimeout = 60 * time.Second
	DefaultExternalIdleTimeout      = 30 * time.Second
	DefaultMaxInFlight              = 64
	DefaultMaxStepBytes             = 8 << 20
	DefaultMaxToolCalls             = 32
)

// minStepBytes is the least MaxStepBytes that holds a step's events.
const minStepBytes = 1 << 10

// StepAuthorizer gives each step request of an external agent its bearer
// token (a JWT signed for the agent, say). It is called for every
// request, retries included, so a token can be short-lived: deadline is
// when the request will have ended at the latest.
type StepAuthorizer interface {
	Authorize(ctx context.Context, req consumer.StepRequest, deadline time.Time) (string, error)
}

// ExternalConfig configures an agent served over HTTP (External).
type ExternalConfig struct {
	// Protocol is what the agent speaks: ProtocolAGUI or ProtocolAISDK
	// (NewExternal), or ProtocolA2A (NewA2A) (--agent). Required.
	Protocol string
	// URL is the agent's endpoint, path included, where each step is
	// posted (BATON_AGENT_URL, --agent-url); for A2A, its JSON-RPC
	// endpoint (the url of its JSONRPC interface in its agent card). It may hold credentials: it
	// is never printed. Required.
	URL string
	// Timeout caps one step request, from the request to the last event,
	// however steadily it streams (BATON_AGENT_TIMEOUT, --agent-timeout):
	// a request is judged by its progress (FirstByteTimeout,
	// IdleTimeout), and this cap only ends one that never finishes.
	// Defaults to 10 minutes.
	Timeout time.Duration
	// FirstByteTimeout bounds the wait for the first byte of the answer's
	// body (BATON_AGENT_FIRST_BYTE_TIMEOUT, --agent-first-byte-timeout).
	// Defaults to 60s.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds a pause in the answer once it has started
	// (BATON_AGENT_IDLE_TIMEOUT, --agent-idle-timeout). An agent that
	// runs a long tool of its own should send something (a comment, a
	// STATE or data event) in the meantime. Defaults to 30s.
	IdleTimeout time.Duration
	// Headers are sent with every request, by name (an API key the agent
	// expects, say; an Authorization header when Authorizer is nil). Their
	// values are never logged or printed. Defaults to none.
	Headers map[string]string
	// TLSCAFile is a PEM file of certificate authorities trusted for an
	// https agent besides the system's (BATON_AGENT_TLS_CA,
	// --agent-tls-ca). It applies to the client Baton builds, not to one
	// given in HTTPClient. Defaults to none.
	TLSCAFile string
	// MaxInFlight caps the requests in flight to the agent at once, across
	// all the worker's turns; a step waits for a slot as long as its
	// context allows. Defaults to 64.
	MaxInFlight int
	// MaxStepBytes caps what is read of one step's answer, every event
	// counted, those Baton skips too (BATON_AGENT_MAX_STEP_BYTES,
	// --agent-max-step-bytes). An answer past it fails the turn with
	// ErrStepTooLarge. Defaults to 8 MiB.
	MaxStepBytes int64
	// MaxToolCalls caps the calls of declared tools one step may ask for
	// (BATON_AGENT_MAX_TOOL_CALLS, --agent-max-tool-calls). A step past it
	// fails the turn with ErrTooManyToolCalls. An A2A agent is declared no
	// tool and asks for none. Defaults to 32.
	MaxToolCalls int
	// MaxRetries is how many times one step request is retried inside the
	// attempt after a 5xx, a 408 or 425, a lost connection, a stream that
	// ended before the step did, a timeout, or a failure the agent
	// reported (RUN_ERROR, an error chunk), with exponential backoff and
	// jitter; and after a 429, 503 or 529 whose Retry-After is at most
	// MaxInlineRetryAfter. A retry posts the same request, with the same
	// runId and Idempotency-Key. A negative value means none. Defaults to
	// DefaultMaxRetries.
	MaxRetries int
	// RetryBaseDelay is the first backoff step; each retry doubles it.
	// Defaults to DefaultRetryBaseDelay.
	RetryBaseDelay time.Duration
	// MaxRetryDelay caps a backoff. Defaults to DefaultMaxRetryDelay.
	MaxRetryDelay time.Duration
	// MaxInlineRetryAfter is the longest Retry-After waited inside the
	// attempt; a longer one, or a rate limit without one, ends the
	// attempt with a *RateLimitError, whose wait the turn runner takes
	// with the turn released. Defaults to DefaultMaxInlineRetryAfter.
	MaxInlineRetryAfter time.Duration
	// RateLimitDelay is the wait a *RateLimitError asks for when the agent
	// sent no Retry-After, on a turn's first attempt; it doubles with each
	// attempt. Defaults to DefaultRateLimitDelay.
	RateLimitDelay time.Duration
	// ThreadID is how the conversation is named to the agent: ThreadIDKey
	// (its server key) or ThreadIDUUID (a UUIDv5 of it)
	// (BATON_AGENT_THREAD_ID, --agent-thread-id); an A2A agent gets it as
	// the contextId. Defaults to ThreadIDKey.
	ThreadID string
	// Audience is who the agent's tokens are for: an Authorizer that signs
	// tokens puts it in their aud claim. Defaults to the URL's origin
	// (scheme, host and port).
	Audience string
	// Authorizer gives each request its bearer token. Defaults to none:
	// no Authorization header but one in Headers.
	Authorizer StepAuthorizer
	// HTTPClient makes the requests. Defaults to a client of its own that
	// trusts TLSCAFile too and follows no redirect.
	HTTPClient *http.Client
	// Logger receives the agent's logs, which add the protocol, the
	// conversation, the run, the turn and the step. It should name the
	// component (the worker's has component=agent). Defaults to no
	// logging.
	Logger *zerolog.Logger
	// Registerer receives the agent's metrics (baton_agent_*), labelled
	// with the protocol, never the URL. Defaults to a private registry.
	Registerer prometheus.Registerer
	// OnOutcome, when set, is told how each step request ended: answered,
	// or failed and why (EndpointOutcome), for a record of whether the
	// agent answers (EndpointRecorder.Observe). A request that Baton
	// abandoned itself (a stopped turn, a lost lease, the turn's deadline)
	// is left out. It is called on the step's goroutine and must not
	// block. Defaults to none.
	OnOutcome func(EndpointOutcome)
}

// WithDefaults returns a copy with every zero field set to its default.
// It builds no HTTP client: NewExternal does.
func (c ExternalConfig) WithDefaults() ExternalConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultExternalTimeout
	}
	if c.FirstByteTimeout == 0 {
		c.FirstByteTimeout = DefaultExternalFirstByteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultExternalIdleTimeout
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxStepBytes == 0 {
		c.MaxStepBytes = DefaultMaxStepBytes
	}
	if c.MaxToolCalls == 0 {
		c.MaxToolCalls = DefaultMaxToolCalls
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.RetryBaseDelay == 0 {
		c.RetryBaseDelay = DefaultRetryBaseDelay
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if c.MaxInlineRetryAfter == 0 {
		c.MaxInlineRetryAfter = DefaultMaxInlineRetryAfter
	}
	if c.RateLimitDelay == 0 {
		c.RateLimitDelay = DefaultRateLimitDelay
	}
	if c.ThreadID == "" {
		c.ThreadID = ThreadIDKey
	}
	if c.Audience == "" {
		if u, err := url.Parse(c.URL); err == nil && u.Host != "" {
			c.Audience = u.Scheme + "://" + u.Host
		}
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// reservedHeaders are the headers Baton sets itself on a step request.
var reservedHeaders = []string{"Accept", "Content-Type", "Content-Length", "Idempotency-Key", "Host", "Transfer-Encoding", "Connection"}

// Validate returns a *setting.Error for the first setting that is wrong.
// It reads TLSCAFile. No error quotes the URL or a header's value.
func (c ExternalConfig) Validate() error {
	switch c.Protocol {
	case ProtocolAGUI, ProtocolAISDK, ProtocolA2A:
	default:
		return setting.Errorf("Protocol", fmt.Sprintf("%q", c.Protocol), "unknown: give %q, %q or %q", ProtocolAGUI, ProtocolAISDK, ProtocolA2A)
	}
	u, err := url.Parse(c.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		// The URL is not printed: it may carry credentials.
		return setting.Errorf("URL", "(not shown)", "not an http(s) URL: give the agent's endpoint, such as http://127.0.0.1:8000/agent")
	case c.Timeout < 0:
		return setting.Errorf("Timeout", c.Timeout, "negative: give a positive duration")
	case c.FirstByteTimeout < 0:
		return setting.Errorf("FirstByteTimeout", c.FirstByteTimeout, "negative: give a positive duration")
	case c.IdleTimeout < 0:
		return setting.Errorf("IdleTimeout", c.IdleTimeout, "negative: give a positive duration")
	case c.MaxInFlight < 1:
		return setting.Errorf("MaxInFlight", c.MaxInFlight, "must be at least 1")
	case c.MaxStepBytes < minStepBytes:
		return setting.Errorf("MaxStepBytes", c.MaxStepBytes, "too small: give at least %d bytes", minStepBytes)
	case c.MaxToolCalls < 1:
		return setting.Errorf("MaxToolCalls", c.MaxToolCalls, "must be at least 1")
	case c.RetryBaseDelay < 0:
		return setting.Errorf("RetryBaseDelay", c.RetryBaseDelay, "must not be negative")
	case c.MaxRetryDelay < 0:
		return setting.Errorf("MaxRetryDelay", c.MaxRetryDelay, "must not be negative")
	case c.MaxInlineRetryAfter < 0:
		return setting.Errorf("MaxInlineRetryAfter", c.MaxInlineRetryAfter, "must not be negative")
	case c.RateLimitDelay < 0:
		return setting.Errorf("RateLimitDelay", c.RateLimitDelay, "must not be negative")
	case c.ThreadID != ThreadIDKey && c.ThreadID != ThreadIDUUID:
		return setting.Errorf("ThreadID", fmt.Sprintf("%q", c.ThreadID), "unknown: give %q (the conversation's key) or %q (a UUIDv5 of it, for agents such as LangGraph)", ThreadIDKey, ThreadIDUUID)
	case c.Audience == "":
		return setting.Errorf("Audience", `""`, "give who the agent's tokens are for, such as its origin https://agent.example.com")
	case c.TLSCAFile != "" && c.HTTPClient != nil:
		return setting.Errorf("TLSCAFile", c.TLSCAFile, "applies to the client Baton builds, and HTTPClient is given: trust the CA in that client's transport instead")
	}
	if err := c.checkHeaders(); err != nil {
		return err
	}
	if c.TLSCAFile != "" {
		if _, err := readCAs(c.TLSCAFile); err != nil {
			return err
		}
	}
	return nil
}

func (c ExternalConfig) checkHeaders() error {
	for name, value := range c.Headers {
		field := "Headers[" + name + "]"
		if !validHeaderName(name) {
			return setting.Errorf("Headers", fmt.Sprintf("%q", truncate(name, 64)), "not a header name: give letters, digits and -")
		}
		for _, r := range reservedHeaders {
			if strings.EqualFold(name, r) || c.Protocol == ProtocolA2A && strings.EqualFold(name, a2a.SvcParamVersion) {
				return setting.Errorf(field, "(not shown)", "Baton sets this header itself: leave it out")
			}
		}
		if strings.EqualFold(name, "Authorization") && c.Authorizer != nil {
			return setting.Errorf(field, "(not shown)", "the Authorizer gives each request its token: leave the header out, or the Authorizer")
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			// The value is not printed: it is likely a secret.
			return setting.Errorf(field, "(not shown)", "the value holds a line break or a NUL: give it on one line (a file's trailing newline is a common cause)")
		}
	}
	return nil
}

// validHeaderName reports whether s is an HTTP token (RFC 9110).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
		default:
			return false
		}
	}
	return true
}

// readCAs reads a PEM file of CA certificates into a copy of the system's
// pool.
func readCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, setting.Errorf("TLSCAFile", path, "cannot be read (%v): give a readable PEM file of CA certificates", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, setting.Errorf("TLSCAFile", path, "holds no PEM certificate: give the CA certificate that signed the agent's certificate ('-----BEGIN CERTIFICATE-----')")
	}
	return pool, nil
}
