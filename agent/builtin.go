package agent

// Builtins chooses the built-in tools a worker offers, as its flags set
// them. The clock is always offered; the others only when configured,
// since each reaches outside Baton.
type Builtins struct {
	// HTTPGetAllow are the hosts http_get may read (--tool-http-get-allow).
	// Defaults to none, which leaves http_get out.
	HTTPGetAllow []string
	// WebhookURL receives the webhook tool's POSTs (--tool-webhook-url).
	// Defaults to none, which leaves the webhook out.
	WebhookURL string
}

// Registry returns a registry with the chosen built-ins, to which a Go
// program may Register its own tools.
func (b Builtins) Registry() (*Registry, error) {
	tools := []Tool{Clock(nil)}
	if len(b.HTTPGetAllow) > 0 {
		get, err := HTTPGet(HTTPGetConfig{AllowHosts: b.HTTPGetAllow})
		if err != nil {
			return nil, err
		}
		tools = append(tools, get)
	}
	if b.WebhookURL != "" {
		hook, err := Webhook(WebhookConfig{URL: b.WebhookURL})
		if err != nil {
			return nil, err
		}
		tools = append(tools, hook)
	}
	reg := NewRegistry()
	if err := reg.Register(tools...); err != nil {
		return nil, err
	}
	return reg, nil
}
