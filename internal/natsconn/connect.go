package natsconn

import (
	"crypto/x509"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
)

// Connect validates o and connects to NATS with its credentials, TLS
// settings, name and inbox prefix, then applies extra (reconnect policy,
// handlers), which may override them. A wrong setting fails before any
// network traffic, with the error Validate gives.
//
// The certificate files are read again on every reconnect, so a renewed
// certificate is picked up without a restart.
//
// Any error it returns has every URL of o redacted, and every password or
// token of them removed, also where the client library quotes them; the
// error still matches the client's sentinel errors with errors.Is (for
// example nats.ErrAuthorization, nats.ErrNoServers).
func Connect(o Options, extra ...nats.Option) (*nats.Conn, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	if o.Name != "" {
		opts = append(opts, nats.Name(o.Name))
	}
	if o.InboxPrefix != DefaultInboxPrefix {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.NKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, &connectError{msg: settingNKeySeed + ": " + o.NKeySeedFile + ": " + scrub(err.Error(), o.URL), cause: err}
		}
		opts = append(opts, opt)
	}
	if o.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	nc, err := nats.Connect(o.URL, append(opts, extra...)...)
	if err != nil {
		return nil, Explain(o, err)
	}
	return nc, nil
}

// Explain returns err, a failed attempt to connect with o, the way Connect
// returns its own failures: the server list redacted, every password or
// token of o's URL scrubbed from the client library's text, and a hint at
// what to check; errors.Is still matches the client's sentinel errors. A
// component that retries in the background (nats.ReconnectErrHandler)
// logs what it gets through it, since a reconnect attempt's error may
// quote a URL too.
func Explain(o Options, err error) error {
	if err == nil {
		return nil
	}
	var ce *connectError
	if errors.As(err, &ce) {
		return err
	}
	o = o.WithDefaults()
	return &connectError{
		msg:   "connect to NATS at " + Redact(o.URL) + ": " + scrub(err.Error(), o.URL) + hint(err, o),
		cause: err,
	}
}

// hint says what to check for the refusals an operator meets first.
func hint(err error, o Options) string {
	switch {
	case errors.Is(err, nats.ErrAuthorization) && o.CredsFile == "" && o.NKeySeedFile == "" && Redact(o.URL) == o.URL:
		return " (the server requires credentials and this process gave none: set " + settingNKeySeed + " or " + settingCreds + " to this component's file, or give a user in " + settingURL + ")"
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return " (the server refused these credentials: check " + settingCreds + ", " + settingNKeySeed + " or the user in " + settingURL + " against the server's accounts)"
	case errors.Is(err, nats.ErrSecureConnWanted):
		return " (TLS is set up here but the server does not offer it: check the URL's port, or the server's tls block)"
	}
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	switch {
	case errors.As(err, &unknownCA):
		return " (the server's certificate is not signed by a CA this process trusts: set " + settingTLSCA + " to the CA that signed it)"
	case errors.As(err, &badHost):
		return " (the server's certificate does not name the host in " + settingURL + ": connect by a name the certificate holds)"
	case strings.Contains(err.Error(), "tls: certificate required"), strings.Contains(err.Error(), "tls: unknown certificate authority"):
		return " (the server requires a client certificate signed by its CA: set " + settingTLSCert + " and " + settingTLSKey + ")"
	}
	return ""
}

// connectError is a connection failure whose text is scrubbed of secrets.
// It answers errors.Is for its cause but does not unwrap to it: the cause's
// own text may quote a URL with its password.
type connectError struct {
	msg   string
	cause error
}

func (e *connectError) Error() string { return e.msg }

// Is reports whether the cause is target, so that callers can tell an
// authorization failure from an unreachable server.
func (e *connectError) Is(target error) bool { return errors.Is(e.cause, target) }
