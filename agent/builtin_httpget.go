package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Defaults of HTTPGetConfig.
const (
	DefaultHTTPGetMaxBytes = 64 << 10
	DefaultHTTPGetTimeout  = 20 * time.Second
)

// HTTPGetConfig configures the http_get tool.
type HTTPGetConfig struct {
	// AllowHosts are the hosts the model may read from, such as
	// "docs.example.com" or "127.0.0.1:8080" (a host without a port
	// allows every port). Required: the model chooses the URL, and a tool
	// that reads anywhere reads the internal network too.
	AllowHosts []string
	// MaxBytes caps the body handed to the model. Defaults to 64 KiB.
	MaxBytes int64
	// Timeout bounds one request. Defaults to 20s.
	Timeout time.Duration
	// Client makes the requests. Defaults to a client with the default
	// transport.
	Client *http.Client
}

// HTTPGet is a read tool that fetches a URL on one of the allowed hosts,
// redirects included, and returns the status and the body.
func HTTPGet(cfg HTTPGetConfig) (Tool, error) {
	if len(cfg.AllowHosts) == 0 {
		return Tool{}, fmt.Errorf("%w http_get: no allowed host: give HTTPGetConfig.AllowHosts", ErrInvalidTool)
	}
	allow := make([]string, len(cfg.AllowHosts))
	for i, h := range cfg.AllowHosts {
		allow[i] = strings.ToLower(strings.TrimSpace(h))
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultHTTPGetMaxBytes
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultHTTPGetTimeout
	}
	base := cfg.Client
	if base == nil {
		base = &http.Client{Transport: http.DefaultTransport}
	}
	allowed := func(u *url.URL) error {
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("%s: only http and https URLs can be read", u.Redacted())
		}
		host := strings.ToLower(u.Host)
		if slices.Contains(allow, host) || slices.Contains(allow, strings.ToLower(u.Hostname())) {
			return nil
		}
		return fmt.Errorf("host %q is not allowed; allowed hosts: %s", u.Host, strings.Join(allow, ", "))
	}
	client := *base
	client.Timeout = cfg.Timeout
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("too many redirects")
		}
		return allowed(req.URL)
	}
	return Tool{
		Name:        "http_get",
		Version:     "1",
		Description: "Fetches a web page or API response with HTTP GET and returns its status and body. Only these hosts can be read: " + strings.Join(allow, ", ") + ".",
		Schema: json.RawMessage(`{
			"type": "object",
			"properties": {"url": {"type": "string", "description": "absolute http or https URL"}},
			"required": ["url"],
			"additionalProperties": false
		}`),
		Effect: Read,
		Handler: func(ctx context.Context, inv Invocation) (string, error) {
			var args struct {
				URL string `json:"url"`
			}
			if err := json.Unmarshal(inv.Arguments, &args); err != nil {
				return "", err
			}
			u, err := url.Parse(args.URL)
			if err != nil || u.Host == "" {
				return "", fmt.Errorf("%q is not an absolute URL", args.URL)
			}
			if err := allowed(u); err != nil {
				return "", err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return "", err
			}
			res, err := client.Do(req)
			if err != nil {
				return "", err
			}
			defer res.Body.Close()
			body, err := io.ReadAll(io.LimitReader(res.Body, cfg.MaxBytes+1))
			if err != nil {
				return "", fmt.Errorf("read body: %w", err)
			}
			suffix := ""
			if int64(len(body)) > cfg.MaxBytes {
				body, suffix = body[:cfg.MaxBytes], fmt.Sprintf("\n[truncated at %d bytes]", cfg.MaxBytes)
			}
			return fmt.Sprintf("HTTP %d\n%s%s", res.StatusCode, strings.ToValidUTF8(string(body), "\uFFFD"), suffix), nil
		},
	}, nil
}
