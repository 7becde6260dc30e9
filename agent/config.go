package agent

import (
	"net/http"
	"net/url"
	"time"

	"github.com/batonhq/baton/internal/setting"
	"github.com/rs/zerolog"
)

// Defaults of a Config.
const (
	DefaultBaseURL           = "https://api.openai.com/v1"
	DefaultRequestTimeout    = 2 * time.Minute
	DefaultMaxModelCalls     = 16
	DefaultMaxToolIterations = 8
	DefaultMaxRetries        = 3
	DefaultRetryBaseDelay    = 500 * time.Millisecond
	DefaultMaxRetryDelay     = 30 * time.Second
)

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
	// SystemPrompt, when set, is the first message of every request.
	// Defaults to none.
	SystemPrompt string
	// RequestTimeout bounds one model call, from the request to the last
	// streamed chunk (--model-timeout). A call that takes longer ends the
	// attempt with ErrModelTimeout, which the turn runner retries like any
	// failed attempt. Defaults to 2 minutes.
	RequestTimeout time.Duration
	// MaxModelCalls caps the model calls of one turn, retries included
	// (--max-model-calls). It bounds what one turn can cost. Defaults to 16.
	MaxModelCalls int
	// MaxToolIterations caps the rounds of tool calls in one turn
	// (--max-tool-iterations): a model that keeps calling tools ends the
	// turn with ErrBudgetExceeded. Defaults to 8.
	MaxToolIterations int
	// MaxRetries is how many times one model call is retried inside the
	// attempt after a 429, a 5xx or a lost connection, with exponential
	// backoff and jitter, or after the server's Retry-After. The client's
	// own retries are off, so these are the only ones. A negative value
	// means none. Defaults to 3.
	MaxRetries int
	// RetryBaseDelay is the first backoff step; each retry doubles it, and
	// a random jitter takes up to half of it away. Defaults to 500ms.
	RetryBaseDelay time.Duration
	// MaxRetryDelay caps a backoff. A Retry-After longer than this ends
	// the attempt instead of holding the conversation. Defaults to 30s.
	MaxRetryDelay time.Duration
	// DisableStreaming asks for whole responses. Live events then carry
	// each step's text at once. Defaults to false (streaming).
	DisableStreaming bool
	// Tools the model may call. Defaults to an empty registry.
	Tools *Registry
	// Live receives partial reply text on the run's live subject (a
	// *nats.Conn fits). Defaults to none: nothing is published.
	Live Publisher
	// HTTPClient makes the requests. Defaults to a client with the
	// default transport.
	HTTPClient *http.Client
	// Logger receives the agent's logs. Defaults to no logging.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxModelCalls == 0 {
		c.MaxModelCalls = DefaultMaxModelCalls
	}
	if c.MaxToolIterations == 0 {
		c.MaxToolIterations = DefaultMaxToolIterations
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
	if c.Tools == nil {
		c.Tools = NewRegistry()
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport}
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
	case c.MaxModelCalls < 1:
		return setting.Errorf("MaxModelCalls", c.MaxModelCalls, "must be at least 1")
	case c.MaxToolIterations < 1:
		return setting.Errorf("MaxToolIterations", c.MaxToolIterations, "must be at least 1")
	case c.RetryBaseDelay < 0:
		return setting.Errorf("RetryBaseDelay", c.RetryBaseDelay, "must not be negative")
	case c.MaxRetryDelay < 0:
		return setting.Errorf("MaxRetryDelay", c.MaxRetryDelay, "must not be negative")
	}
	return nil
}
