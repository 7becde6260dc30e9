package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Defaults of WebhookConfig.
const (
	DefaultWebhookName       = "webhook"
	DefaultWebhookTimeout    = 20 * time.Second
	DefaultWebhookRetries    = 2
	DefaultWebhookRetryDelay = 200 * time.Millisecond
)

// WebhookConfig configures a webhook tool.
type WebhookConfig struct {
	// URL receives the POSTs. The model chooses what is sent, never where.
	// Required.
	URL string
	// Name of the tool. Defaults to "webhook".
	Name string
	// Description tells the model what the webhook does (for example
	// "Opens a ticket in the support queue"). Defaults to a generic one.
	Description string
	// Header is added to every request, for example an authorization.
	// Defaults to none.
	Header http.Header
	// Timeout bounds one request. Defaults to 20s.
	Timeout time.Duration
	// Retries is how many times a request that failed with a 5xx, a 429
	// or a lost connection is sent again, with the same Idempotency-Key.
	// Defaults to 2; a negative value means none.
	Retries int
	// RetryDelay is the wait before the first retry, doubled for each
	// next one. Defaults to 200ms.
	RetryDelay time.Duration
	// Client makes the requests. Defaults to a client with the default
	// transport.
	Client *http.Client
}

// Webhook is a write tool that POSTs {"payload": ...} as JSON to a fixed
// URL, with the call's idempotency key in the Idempotency-Key header: a
// receiver that keeps the keys it has seen applies a retried delivery
// once.
func Webhook(cfg WebhookConfig) (Tool, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultWebhookName
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Tool{}, fmt.Errorf("%w %s: URL %q is not an http(s) URL: give WebhookConfig.URL", ErrInvalidTool, cfg.Name, cfg.URL)
	}
	if cfg.Description == "" {
		cfg.Description = "Sends a JSON payload to a webhook. It changes things outside this conversation: call it once per action the user asked for."
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultWebhookTimeout
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultWebhookRetries
	}
	cfg.Retries = max(cfg.Retries, 0)
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = DefaultWebhookRetryDelay
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport}
	}
	post := func(ctx context.Context, body []byte, key string) (int, string, error) {
		ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		for k, vs := range cfg.Header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		text, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		return res.StatusCode, string(text), nil
	}
	return Tool{
		Name:        cfg.Name,
		Version:     "1",
		Description: cfg.Description,
		Schema: json.RawMessage(`{
			"type": "object",
			"properties": {"payload": {"description": "the JSON value to send"}},
			"required": ["payload"],
			"additionalProperties": false
		}`),
		Effect: Write,
		Handler: func(ctx context.Context, inv Invocation) (string, error) {
			var args struct {
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(inv.Arguments, &args); err != nil {
				return "", err
			}
			body, err := json.Marshal(map[string]any{"payload": args.Payload})
			if err != nil {
				return "", err
			}
			delay := cfg.RetryDelay
			for attempt := 0; ; attempt++ {
				status, text, err := post(ctx, body, inv.IdempotencyKey)
				if err == nil && status >= 200 && status < 300 {
					return fmt.Sprintf("delivered (HTTP %d) %s", status, truncate(text, 500)), nil
				}
				retryable := err != nil || status == http.StatusTooManyRequests || status >= 500
				if err == nil {
					err = fmt.Errorf("the webhook answered HTTP %d: %s", status, truncate(text, 500))
				}
				if !retryable || attempt >= cfg.Retries || ctx.Err() != nil {
					return "", err
				}
				timer := time.NewTimer(delay)
				select {
				case <-ctx.Done():
					timer.Stop()
					return "", err
				case <-timer.C:
				}
				delay *= 2
			}
		},
	}, nil
}
