// Package natsconn is how every Baton component connects to NATS: one
// function that takes the server list, the component's credentials (a
// .creds file, an nkey seed, or a user and password or token in the URL),
// TLS settings and a private inbox prefix, checks them before any network
// traffic, and never lets a secret reach an error message.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nkeys"

	batonnats "github.com/batonhq/baton/nats"
)

// Defaults of the connection settings.
const (
	// DefaultURL is a NATS server on this machine.
	DefaultURL = batonnats.DefaultURL
	// DefaultInboxPrefix is the inbox prefix of every NATS client.
	DefaultInboxPrefix = "_INBOX"
)

// Options say where NATS is and how a component proves who it is. The zero
// value connects to DefaultURL without credentials or TLS, as in
// development.
type Options struct {
	// URL of the NATS server, or the servers of a cluster as a
	// comma-separated list (--nats-url / BATON_NATS_URL). A user and
	// password (nats://user:password@host:4222) or a token
	// (nats://token@host:4222) in it authenticate the way every NATS
	// client does; CredsFile and NKeySeedFile keep the secret out of
	// process listings and are preferred. tls:// asks for TLS. Defaults
	// to nats://127.0.0.1:4222.
	URL string

	// Name of the connection, shown by the server's monitoring (connz)
	// so that an operator can tell components apart. Defaults to none.
	Name string

	// CredsFile is a .creds file, a user JWT and its nkey seed, for a
	// server in operator (JWT) mode (--nats-creds / BATON_NATS_CREDS).
	// Defaults to none.
	CredsFile string

	// NKeySeedFile is a file holding the seed of an nkey user, for a
	// server whose configuration lists users by public nkey
	// (--nats-nkey-seed / BATON_NATS_NKEY_SEED). Defaults to none.
	NKeySeedFile string

	// TLSCAFile is a PEM file of the certificate authorities that signed
	// the servers' certificates. Setting it turns TLS on
	// (--nats-tls-ca / BATON_NATS_TLS_CA). Defaults to none: the system's
	// authorities, when the server or a tls:// URL asks for TLS.
	TLSCAFile string

	// TLSCertFile is a PEM client certificate, for servers that require
	// one (mutual TLS); it needs TLSKeyFile (--nats-tls-cert /
	// BATON_NATS_TLS_CERT). Defaults to none.
	TLSCertFile string

	// TLSKeyFile is the private key of TLSCertFile (--nats-tls-key /
	// BATON_NATS_TLS_KEY). Defaults to none.
	TLSKeyFile string

	// InboxPrefix is where replies to this component arrive: JetStream
	// API answers, publish acknowledgements and pulled messages. With a
	// prefix per component and permissions that let each subscribe to its
	// own prefix only, no component can read another's replies
	// (--nats-inbox-prefix / BATON_NATS_INBOX_PREFIX). Defaults to _INBOX.
	InboxPrefix string
}

// WithDefaults returns a copy with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if strings.TrimSpace(o.URL) == "" {
		o.URL = DefaultURL
	}
	if o.InboxPrefix == "" {
		o.InboxPrefix = DefaultInboxPrefix
	}
	return o
}

// Settings as a user names them, in errors.
const (
	settingURL         = "--nats-url / BATON_NATS_URL"
	settingCreds       = "--nats-creds / BATON_NATS_CREDS"
	settingNKeySeed    = "--nats-nkey-seed / BATON_NATS_NKEY_SEED"
	settingTLSCA       = "--nats-tls-ca / BATON_NATS_TLS_CA"
	settingTLSCert     = "--nats-tls-cert / BATON_NATS_TLS_CERT"
	settingTLSKey      = "--nats-tls-key / BATON_NATS_TLS_KEY"
	settingInboxPrefix = "--nats-inbox-prefix / BATON_NATS_INBOX_PREFIX"
)

// Validate returns an error naming the first setting that cannot work and
// how to fix it. It reads the files it is given, so a missing or
// unreadable file fails here, at start, rather than at the first
// reconnect. No error quotes a password, token, seed or file content.
func (o Options) Validate() error {
	hasUserInfo, err := validateURLs(o.URL)
	if err != nil {
		return err
	}
	switch {
	case o.CredsFile != "" && o.NKeySeedFile != "":
		return fmt.Errorf("%s and %s are both set: a connection authenticates one way; give the .creds file for a server in operator (JWT) mode, or the nkey seed for a server that lists nkey users", settingCreds, settingNKeySeed)
	case hasUserInfo && o.CredsFile != "":
		return fmt.Errorf("%s holds a user or token and %s is set too: a connection authenticates one way; remove the user information from the URL or unset the creds file", settingURL, settingCreds)
	case hasUserInfo && o.NKeySeedFile != "":
		return fmt.Errorf("%s holds a user or token and %s is set too: a connection authenticates one way; remove the user information from the URL or unset the seed file", settingURL, settingNKeySeed)
	}
	if o.CredsFile != "" {
		if err := checkCreds(o.CredsFile); err != nil {
			return err
		}
	}
	if o.NKeySeedFile != "" {
		if err := checkSeed(o.NKeySeedFile); err != nil {
			return err
		}
	}
	if o.TLSCAFile != "" {
		if err := checkCA(o.TLSCAFile); err != nil {
			return err
		}
	}
	switch {
	case o.TLSCertFile != "" && o.TLSKeyFile == "":
		return fmt.Errorf("%s is set but %s is not: a client certificate needs its private key; give both, or neither", settingTLSCert, settingTLSKey)
	case o.TLSKeyFile != "" && o.TLSCertFile == "":
		return fmt.Errorf("%s is set but %s is not: a private key needs its client certificate; give both, or neither", settingTLSKey, settingTLSCert)
	case o.TLSCertFile != "":
		if err := checkKeyPair(o.TLSCertFile, o.TLSKeyFile); err != nil {
			return err
		}
	}
	if o.InboxPrefix != "" && !validInboxPrefix(o.InboxPrefix) {
		return fmt.Errorf("%s %q is not a subject prefix: use dot-separated tokens without '*', '>' or spaces, such as _INBOX_worker", settingInboxPrefix, o.InboxPrefix)
	}
	return nil
}

// validateURLs checks every element of a comma-separated URL list the way
// the NATS client will read it, and reports whether any carries user
// information.
func validateURLs(list string) (hasUserInfo bool, err error) {
	if strings.TrimSpace(list) == "" {
		return false, fmt.Errorf("no NATS server given: set %s (for example nats://127.0.0.1:4222, or several, comma-separated)", settingURL)
	}
	for i, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return false, fmt.Errorf("%s %q has an empty element: separate the servers' URLs with single commas", settingURL, Redact(list))
		}
		raw := e
		if !strings.Contains(e, "://") {
			// The client takes host:port as nats://host:port.
			raw = "nats://" + e
		}
		u, perr := url.Parse(raw)
		if perr != nil || u.Host == "" || u.Hostname() == "" {
			return false, fmt.Errorf("%s: element %d of %q is not a NATS server URL: give nats://host:port (or tls://, ws://, wss://), several comma-separated; percent-encode characters such as '@', ':', '/' or ',' in a password", settingURL, i+1, Redact(list))
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return false, fmt.Errorf("%s: element %d of %q has the scheme %q: NATS clients speak nats://, tls://, ws:// and wss://", settingURL, i+1, Redact(list), u.Scheme)
		}
		if u.User != nil {
			hasUserInfo = true
		}
	}
	return hasUserInfo, nil
}

// readSetting reads the file of a setting, with an error that names the
// setting and the file but never the content.
func readSetting(setting, path, what string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return b, nil
	}
	var reason string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		reason = "does not exist"
	case errors.Is(err, fs.ErrPermission):
		reason = "is not readable by this user"
	default:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			reason = "cannot be read: " + pe.Err.Error()
		} else {
			reason = "cannot be read"
		}
	}
	return nil, fmt.Errorf("%s: %s %s: give the path of %s that this process can read", setting, path, reason, what)
}

func checkCreds(path string) error {
	b, err := readSetting(settingCreds, path, "a .creds file (a user JWT and its nkey seed)")
	if err != nil {
		return err
	}
	defer wipe(b)
	jwt, _ := nkeys.ParseDecoratedJWT(b)
	if !looksLikeJWT(jwt) {
		return fmt.Errorf("%s: %s holds no user JWT: give a .creds file as the account's operator issues it (a '-----BEGIN NATS USER JWT-----' block, then the seed)", settingCreds, path)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("%s: %s holds no user nkey seed: give a complete .creds file (the JWT, then a '-----BEGIN USER NKEY SEED-----' block)", settingCreds, path)
	}
	kp.Wipe()
	return nil
}

// looksLikeJWT reports whether s has the shape of a JWT: three base64url
// parts. ParseDecoratedJWT returns a file without JWT markers whole.
func looksLikeJWT(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if p == "" {
			return false
		}
		for _, r := range p {
			if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

func checkSeed(path string) error {
	b, err := readSetting(settingNKeySeed, path, "an nkey seed file")
	if err != nil {
		return err
	}
	defer wipe(b)
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("%s: %s holds no nkey user seed (a line starting with SU): give the seed file made for this component's user (deploy/nats: make-nkeys)", settingNKeySeed, path)
	}
	kp.Wipe()
	return nil
}

func checkCA(path string) error {
	b, err := readSetting(settingTLSCA, path, "a PEM file of CA certificates")
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return fmt.Errorf("%s: %s holds no PEM certificate: give the CA certificate that signed the servers' certificates ('-----BEGIN CERTIFICATE-----')", settingTLSCA, path)
	}
	return nil
}

func checkKeyPair(certPath, keyPath string) error {
	cert, err := readSetting(settingTLSCert, certPath, "a PEM client certificate")
	if err != nil {
		return err
	}
	key, err := readSetting(settingTLSKey, keyPath, "the PEM private key of the client certificate")
	if err != nil {
		return err
	}
	defer wipe(key)
	if blk, _ := pem.Decode(cert); blk == nil || blk.Type != "CERTIFICATE" {
		return fmt.Errorf("%s: %s holds no PEM certificate: give the client certificate ('-----BEGIN CERTIFICATE-----')", settingTLSCert, certPath)
	}
	// crypto/tls's errors name what is wrong, never the key's bytes.
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return fmt.Errorf("%s and %s: %s and %s are not a certificate and its private key (%v): give the key that belongs to the certificate", settingTLSCert, settingTLSKey, certPath, keyPath, err)
	}
	return nil
}

func validInboxPrefix(p string) bool {
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return false
		}
	}
	return true
}

// wipe overwrites a buffer that held a secret, so it does not linger in
// memory until the collector reuses it.
func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}
