package group

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// WebhookGroup is the name of the built-in webhook group.
const WebhookGroup = "webhook"

// Headers of a webhook request.
const (
	// HeaderWebhookSignature is "sha256=" and the hex HMAC-SHA256 of the
	// request body under the shared secret.
	HeaderWebhookSignature = "Baton-Signature"
	// HeaderWebhookEventID is the event's ID: the same on every delivery
	// of one event, so the receiver can deduplicate on it.
	HeaderWebhookEventID = "Baton-Event-Id"
	// HeaderWebhookAttempt counts deliveries of the event, from 1.
	HeaderWebhookAttempt = "Baton-Attempt"
)

// DefaultWebhookTimeout bounds one webhook request.
const DefaultWebhookTimeout = 10 * time.Second

// WebhookConfig configures the built-in webhook handler. Retries and their
// backoff are the group's (GroupConfig.MaxAttempts, RetryMin, RetryMax): a
// failed request hands the event back and frees the lane.
type WebhookConfig struct {
	// URL receives one POST per event. Required.
	URL string
	// Secret keys the HMAC-SHA256 signature of each body. Required.
	Secret string
	// Timeout bounds one request, response included. Defaults to 10s.
	Timeout time.Duration
	// Client sends the requests; it must not follow redirects for the
	// error handling below to hold. Defaults to a client that does not.
	Client *http.Client
}

// WithDefaults returns a copy with every zero field set to its default.
func (c WebhookConfig) WithDefaults() WebhookConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultWebhookTimeout
	}
	if c.Client == nil {
		c.Client = &http.Client{
			// A redirect would turn the POST into a GET or resend the body
			// elsewhere; the configured URL must be the final one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c
}

// Validate returns an error naming the first setting that is wrong.
func (c WebhookConfig) Validate() error {
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		return errors.New("no webhook URL given: set --webhook-url / BATON_WEBHOOK_URL")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("--webhook-url / BATON_WEBHOOK_URL %q is not an http(s) URL such as https://example.com/hooks/baton", c.URL)
	case c.Secret == "":
		return errors.New("no webhook secret given: set BATON_WEBHOOK_SECRET (or --webhook-secret); receivers verify the Baton-Signature header with it")
	case c.Timeout <= 0:
		return fmt.Errorf("webhook timeout %s must be positive (--webhook-timeout / BATON_WEBHOOK_TIMEOUT)", c.Timeout)
	}
	return nil
}

// WebhookPayload is the JSON body of a webhook request.
type WebhookPayload struct {
	EventID        string    `json:"event_id"`
	Group          string    `json:"group"`
	Stream         string    `json:"stream"`
	StreamSeq      uint64    `json:"stream_seq"`
	Subject        string    `json:"subject"`
	PublishedAt    time.Time `json:"published_at"`
	OutboxID       int64     `json:"outbox_id"`
	ConversationID string    `json:"conversation_id"`
	MessageID      string    `json:"message_id"`
	Reason         string    `json:"reason"`
	CreatedAt      time.Time `json:"created_at"`
}

// SignWebhook returns the Baton-Signature value of body under secret.
func SignWebhook(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// VerifyWebhook reports whether signature is body's Baton-Signature under
// secret, in constant time. Receivers call it before trusting a request.
func VerifyWebhook(secret string, body []byte, signature string) bool {
	return hmac.Equal([]byte(SignWebhook(secret, body)), []byte(signature))
}

// Webhook returns the built-in webhook group's handler: it POSTs each event
// as a WebhookPayload, signed, with its event ID. A 2xx answer applies the
// event; a timeout, a network error, 408, 425, 429 or 5xx is retried by the
// group with backoff; any other answer (a 4xx, a redirect) means retrying
// cannot help, and the event is parked at once with the answer as its
// error. The request is at least once: a receiver must deduplicate on
// Baton-Event-Id.
func Webhook(cfg WebhookConfig) (Handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return func(ctx context.Context, _ pgx.Tx, ev Event) error {
		body, err := json.Marshal(WebhookPayload{
			EventID: ev.ID, Group: ev.Group, Stream: ev.Stream, StreamSeq: ev.StreamSeq, Subject: ev.Subject,
			PublishedAt: ev.PublishedAt, OutboxID: ev.OutboxID, ConversationID: ev.ConversationID,
			MessageID: ev.MessageID, Reason: string(ev.Reason), CreatedAt: ev.CreatedAt,
		})
		if err != nil {
			return Permanent(err)
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
		if err != nil {
			return Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "baton-webhook")
		req.Header.Set(HeaderWebhookEventID, ev.ID)
		req.Header.Set(HeaderWebhookAttempt, strconv.Itoa(ev.Attempt))
		req.Header.Set(HeaderWebhookSignature, SignWebhook(cfg.Secret, body))
		resp, err := cfg.Client.Do(req)
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				return fmt.Errorf("webhook %s did not answer within %s", cfg.URL, cfg.Timeout)
			}
			return fmt.Errorf("webhook %s: %w", cfg.URL, err)
		}
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return nil
		}
		err = fmt.Errorf("webhook %s answered %s: %s", cfg.URL, resp.Status, strings.TrimSpace(string(snippet)))
		switch {
		case resp.StatusCode >= 500, resp.StatusCode == http.StatusRequestTimeout,
			resp.StatusCode == http.StatusTooEarly, resp.StatusCode == http.StatusTooManyRequests:
			return err
		default:
			return Permanent(err)
		}
	}, nil
}
