package agent

import (
	"net/http"
	"net/url"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/rs/zerolog"
)

// Defaults of a Config.
const (
	DefaultBaseURL             = "https://api.openai.com/v1"
	DefaultRequestTimeout      = 10 * time.Minute
	DefaultFirstByteTimeout    = 60 * time.Second
	DefaultIdleTimeout         = 30 * time.Second
	DefaultMaxModelCalls       = 16
	DefaultMaxRetries          = 3
	DefaultRetryBaseDelay      = 500 * time.Millisecond
	DefaultMaxRetryDelay       = 30 * time.Second
	DefaultMaxInlineRetryAfter = 2 * time.Second
	DefaultRateLimitDelay      = 2 * time.Second
	DefaultContextTokens       = 32000
	DefaultMaxToolResultBytes  = 16 << 10
)

// minConversationTokens is the least of ContextTokens that must be left
// for the conversation after the system prompt and the tool declarations.
const minConversationTokens = 1000

// Config configures the OpenAI-compatible agent.
type Config struct {
	// BaseURL is the model server's API root, the part before
	// /chat/completions (BATON_MODEL_BASE_URL, --model-base-url). Local
	// servers usually serve it at http://127.0.0.1:<port>/v1. Defaults to
	// DefaultBaseURL.
	BaseURL string
	// APIKey is sent as a bearer token (BATON_MODEL_API_KEY,
	// --model-api-key). Local servers often need none. Defaults to none.
	APIKey string
	// Model is the model name the server knows (BATON_MODEL, --model).
	// Required.
	Model string
	// ModelMedia are the media types of files the model server takes as
	// content parts (BATON_MODEL_MEDIA, --model-media): an image as
	// image_url, anything else as file, with the bytes in a data URL.
	// "image/*" takes every image type. A text file of a type not listed
	// is sent as text; any other file fails the turn with a visible error.
	// Defaults to DefaultModelMedia (images).
	ModelMedia []string
	// SystemPrompt, when set, is the first message of every request.
	// Defaults to none.
	SystemPrompt string
	// RequestTimeout caps one model call, from the request to the last
	// streamed chunk, however steadily it streams (BATON_MODEL_TIMEOUT,
	// --model-timeout): a call is judged by its progress (FirstByteTimeout,
	// IdleTimeout), and this cap only ends one that never finishes. A call
	// past it ends the attempt with ErrModelTimeout, which the turn runner
	// retries like any failed attempt. Defaults to 10 minutes.
	RequestTimeout time.Duration
	// FirstByteTimeout bounds the wait for the first byte of the answer:
	// the first chunk of a stream, or the whole response of a request that
	// does not stream (BATON_MODEL_FIRST_BYTE_TIMEOUT,
	// --model-first-byte-timeout). Past it the attempt ends with
	// ErrModelTimeout. Defaults to 60s.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds a pause in the answer once it has started
	// (BATON_MODEL_IDLE_TIMEOUT, --model-idle-timeout): a stream that sends
	// nothing for longer ends the attempt with ErrModelTimeout. A stream
	// that keeps sending is never cut for being long. Defaults to 30s.
	IdleTimeout time.Duration
	// MaxModelCalls caps the model calls of one turn, retries included
	// (--max-model-calls). It bounds what one turn can cost. Defaults to 16.
	MaxModelCalls int
	// MaxRetries is how many times one model call is retried inside the
	// attempt after a 5xx (other than 503 and 529), a 408 or a lost
	// connection, with exponential backoff and jitter, and after a 429,
	// 503 or 529 whose Retry-After is at most MaxInlineRetryAfter. A
	// malformed answer is retried once, if MaxRetries allows any. The
	// client's own retries are off, so these are the only ones. A negative
	// value means none. Defaults to 3.
	MaxRetries int
	// RetryBaseDelay is the first backoff step inside an attempt; each
	// retry doubles it, and a random jitter takes up to half of it away.
	// Defaults to 500ms.
	RetryBaseDelay time.Duration
	// MaxRetryDelay caps a backoff. Defaults to 30s.
	MaxRetryDelay time.Duration
	// MaxInlineRetryAfter is the longest Retry-After waited inside the
	// attempt. A rate limit or an overload (429, 503, 529) that asks for
	// longer, or sends no Retry-After, ends the attempt at once with a
	// *RateLimitError, whose RetryAfter the turn runner waits with the
	// turn released rather than holding its lease. Keep it well under the
	// lease. Defaults to 2s.
	MaxInlineRetryAfter time.Duration
	// RateLimitDelay is the wait a *RateLimitError asks for when the
	// server sent no Retry-After, on a turn's first attempt; it doubles
	// with each attempt, up to MaxRetryDelay, less a jitter. Defaults to
	// 2s.
	RateLimitDelay time.Duration
	// ContextTokens is the budget of one request, in estimated tokens
	// (see EstimateTokens): system prompt, tool declarations, the turn's
	// messages and tool rounds, and as much history as fits
	// (BATON_MODEL_CONTEXT_TOKENS, --model-context-tokens). No request is
	// larger, however long the conversation. Set it to the model's context
	// window less the room its answers need. Defaults to 32000.
	ContextTokens int
	// MaxToolResultBytes caps a tool's result as the model reads it
	// (BATON_MODEL_MAX_TOOL_RESULT_BYTES, --model-max-tool-result-bytes):
	// a longer one keeps its start and its end around a marker. The
	// journal keeps the whole result. Defaults to 16 KiB.
	MaxToolResultBytes int
	// DisableStreaming asks for whole responses, for servers that cannot
	// stream (--model-streaming=false, BATON_MODEL_STREAMING=false). Live
	// events then carry each step's text at once. Defaults to false
	// (streaming).
	DisableStreaming bool
	// HTTPClient makes the requests. Defaults to a client of its own whose
	// transport is the default one, keeping up to
	// DefaultMaxIdleConnsPerHost idle connections to the model server.
	HTTPClient *http.Client
	// Logger receives the agent's logs, which add the model, the
	// conversation, the run and the turn to its fields. It should name the
	// component (the worker's has component=agent): the agent adds none.
	// Defaults to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if len(c.ModelMedia) == 0 {
		c.ModelMedia = DefaultModelMedia
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.FirstByteTimeout == 0 {
		c.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxModelCalls == 0 {
		c.MaxModelCalls = DefaultMaxModelCalls
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
	if c.ContextTokens == 0 {
		c.ContextTokens = DefaultContextTokens
	}
	if c.MaxToolResultBytes == 0 {
		c.MaxToolResultBytes = DefaultMaxToolResultBytes
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: modelTransport()}
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns a *setting.Error for the first setting that is wrong.
func (c Config) Validate() error {
	u, err := url.Parse(c.BaseURL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		// The URL is not printed: it may carry credentials.
		return setting.Errorf("BaseURL", "(not shown)", "not an http(s) URL: give the API root, such as http://127.0.0.1:8000/v1")
	case c.Model == "":
		return setting.Errorf("Model", `""`, "give a model the server knows")
	case c.RequestTimeout < 0:
		return setting.Errorf("RequestTimeout", c.RequestTimeout, "negative: give a positive duration")
	case c.FirstByteTimeout < 0:
		return setting.Errorf("FirstByteTimeout", c.FirstByteTimeout, "negative: give a positive duration")
	case c.IdleTimeout < 0:
		return setting.Errorf("IdleTimeout", c.IdleTimeout, "negative: give a positive duration")
	case c.MaxModelCalls < 1:
		return setting.Errorf("MaxModelCalls", c.MaxModelCalls, "must be at least 1")
	case c.RetryBaseDelay < 0:
		return setting.Errorf("RetryBaseDelay", c.RetryBaseDelay, "must not be negative")
	case c.MaxRetryDelay < 0:
		return setting.Errorf("MaxRetryDelay", c.MaxRetryDelay, "must not be negative")
	case c.MaxInlineRetryAfter < 0:
		return setting.Errorf("MaxInlineRetryAfter", c.MaxInlineRetryAfter, "must not be negative")
	case c.RateLimitDelay < 0:
		return setting.Errorf("RateLimitDelay", c.RateLimitDelay, "must not be negative")
	case c.MaxToolResultBytes < 256:
		return setting.Errorf("MaxToolResultBytes", c.MaxToolResultBytes, "too small: give at least 256 bytes")
	case c.ContextTokens < 0:
		return setting.Errorf("ContextTokens", c.ContextTokens, "negative: give the model's context window less the room for its answer")
	}
	return c.CheckTools(nil)
}

// CheckTools reports a ContextTokens too small for the system prompt, the
// declarations of tools and a conversation (a *setting.Error): a worker
// checks it at start with the tools it always offers.
func (c Config) CheckTools(tools []consumer.ToolSpec) error {
	fixed := TokensPerRequest + toolTokens(toolParamsOf(tools))
	if c.SystemPrompt != "" {
		fixed += TokensPerMessage + EstimateTokens(c.SystemPrompt)
	}
	if c.ContextTokens < fixed+minConversationTokens {
		return setting.Errorf("ContextTokens", c.ContextTokens, "too small: the system prompt and the tool declarations take about %d tokens, and a conversation needs %d more: give at least %d", fixed, minConversationTokens, fixed+minConversationTokens)
	}
	return nil
}

// DefaultMaxIdleConnsPerHost is how many idle connections to the model
// server the default HTTPClient keeps. The default transport keeps two:
// with more turns calling the model at once, every call past the second
// opened a connection of its own (a TLS handshake, with a provider) and
// closed it after. Idle ones close after 90 seconds, as the default
// transport's do.
const DefaultMaxIdleConnsPerHost = 1024

// modelTransport is the default transport with room for
// DefaultMaxIdleConnsPerHost idle connections.
func modelTransport() http.RoundTripper {
	d, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t := d.Clone()
	t.MaxIdleConns = max(t.MaxIdleConns, DefaultMaxIdleConnsPerHost)
	t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	return t
}
