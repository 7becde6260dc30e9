// Package jwtauth verifies the JSON Web Tokens of an application's own
// sign-in, so that its users reach Baton without a Baton token: tokens an
// OpenID Connect provider signs with a key it publishes (RS256, ES256,
// EdDSA, keys from its JWKS, found by discovery or named directly), and
// tokens a backend mints itself with a shared HS256 secret. A verified
// token names a user "<iss>|<user claim>": the same subject from two
// issuers is two users.
//
// The keys of a provider are fetched over HTTPS with a timeout and a size
// limit and kept in memory. A token signed by a key not among them makes
// the set be fetched again, at most once per MinRefetch; while the provider
// cannot be reached, the keys already fetched keep working and every other
// key is refused.
//
// It also signs the tokens Baton sends: each step request the worker posts
// to an external agent carries a short-lived JWT signed with an Ed25519
// key (SigningKey), whose public half the API serves as a JWKS
// (PublicKeys), so that the agent can verify that the call comes from
// Baton and for whom.
package jwtauth

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/setting"
)

// Defaults of Config.
const (
	// DefaultUserClaim is the claim that names the user.
	DefaultUserClaim = "sub"
	// DefaultLeeway is how far the clocks of the issuer and of Baton may
	// disagree: exp, nbf and iat are honoured this much either way.
	DefaultLeeway = 30 * time.Second
	// DefaultMinRefetch is the least time between two fetches of the
	// provider's keys that a token with an unknown kid may cause.
	DefaultMinRefetch = 30 * time.Second
	// DefaultKeysMaxAge is how long fetched keys are used before they are
	// fetched again, so that a key the provider withdrew stops working.
	DefaultKeysMaxAge = 15 * time.Minute
	// DefaultFetchTimeout bounds one request to the provider (discovery
	// or JWKS), from connecting to the end of the body.
	DefaultFetchTimeout = 5 * time.Second
	// DefaultMaxResponseBytes bounds a discovery document or a JWKS.
	DefaultMaxResponseBytes = 64 << 10
	// DefaultMaxTokenBytes bounds a token; a larger one is refused
	// before it is decoded.
	DefaultMaxTokenBytes = 8 << 10
	// MinHS256SecretBytes is the least length of the HS256 secret: the
	// size of the hash (RFC 7518, section 3.2).
	MinHS256SecretBytes = 32
)

// AsymmetricAlgorithms are the algorithms accepted from an OpenID Connect
// provider, with a key of its JWKS. Nothing else is: not "none", not HS256
// (a provider's public key is no secret), not RSA with PKCS #1 v1.5 over
// other hashes.
var AsymmetricAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA}

// Config says whose tokens are accepted. A zero Config accepts none.
type Config struct {
	// Issuer is the OpenID Connect provider's issuer, exactly as its
	// tokens carry it in iss (Auth0's ends with a slash). Its keys are
	// found by discovery (Issuer + "/.well-known/openid-configuration")
	// unless JWKSURL names them. It must not contain "|". Defaults to
	// none: no provider's tokens are accepted.
	Issuer string
	// JWKSURL is where the provider publishes its keys, for a provider
	// without discovery or to skip it; Issuer is still required.
	// Defaults to the jwks_uri of the discovery document.
	JWKSURL string
	// Audience must be one of a token's aud values, for every token,
	// from the provider or HS256. Required when any token is accepted.
	Audience string
	// HS256Secret is the secret a backend signs its own short-lived
	// tokens with (at least 32 bytes); it is never used with a token
	// that names another algorithm. Defaults to none: HS256 is refused.
	HS256Secret []byte
	// HS256Issuer is the iss every HS256 token must carry: the name of
	// the backend that mints them, which keeps its users apart from the
	// provider's. Required with HS256Secret; must differ from Issuer and
	// not contain "|".
	HS256Issuer string
	// UserClaim is the claim whose value, a non-empty string, names the
	// user after the issuer. Defaults to "sub".
	UserClaim string
	// AllowHTTP lets Issuer, JWKSURL and the discovered jwks_uri be plain
	// HTTP, for development only: anyone on the path could swap the keys.
	// Defaults to false: HTTPS only.
	AllowHTTP bool
	// Leeway is how much exp, nbf and iat may be off. Defaults to 30s.
	Leeway time.Duration
	// MinRefetch is the least time between two fetches of the keys caused
	// by tokens with an unknown kid (a failed fetch counts too). Defaults
	// to 30s.
	MinRefetch time.Duration
	// KeysMaxAge is how long fetched keys are used before the next token
	// fetches them again; when that fetch fails the keys stay in use.
	// Defaults to 15m.
	KeysMaxAge time.Duration
	// FetchTimeout bounds one request to the provider. Defaults to 5s.
	FetchTimeout time.Duration
	// MaxResponseBytes bounds the discovery document and the JWKS; a
	// larger answer is refused whole. Defaults to 64 KiB.
	MaxResponseBytes int
	// MaxTokenBytes bounds a token. Defaults to 8 KiB.
	MaxTokenBytes int
	// Transport carries the requests to the provider. Defaults to
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Logger receives the outcome of key fetches. Defaults to no logging.
	Logger *zerolog.Logger
}

// Enabled reports whether any JWT is accepted.
func (c Config) Enabled() bool {
	return c.Issuer != "" || len(c.HS256Secret) > 0 || c.HS256Issuer != ""
}

// WithDefaults returns a copy of c with every zero field set.
func (c Config) WithDefaults() Config {
	if c.UserClaim == "" {
		c.UserClaim = DefaultUserClaim
	}
	if c.Leeway == 0 {
		c.Leeway = DefaultLeeway
	}
	if c.MinRefetch == 0 {
		c.MinRefetch = DefaultMinRefetch
	}
	if c.KeysMaxAge == 0 {
		c.KeysMaxAge = DefaultKeysMaxAge
	}
	if c.FetchTimeout == 0 {
		c.FetchTimeout = DefaultFetchTimeout
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxTokenBytes == 0 {
		c.MaxTokenBytes = DefaultMaxTokenBytes
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate reports the first setting that cannot work, as a
// *setting.Error; it never puts the secret in the error. It expects
// defaults applied (WithDefaults).
func (c Config) Validate() error {
	if !c.Enabled() {
		if c.JWKSURL != "" {
			return setting.Errorf("JWKSURL", c.JWKSURL, "needs the issuer too (--jwt-issuer): it is what the tokens' iss must be")
		}
		return nil
	}
	if c.Issuer != "" {
		if strings.Contains(c.Issuer, "|") {
			return setting.Errorf("Issuer", c.Issuer, `must not contain "|": a user is named "<issuer>|<subject>"`)
		}
		if err := c.checkURL("Issuer", c.Issuer); err != nil {
			return err
		}
	}
	if c.JWKSURL != "" {
		if c.Issuer == "" {
			return setting.Errorf("JWKSURL", c.JWKSURL, "needs the issuer too (--jwt-issuer): it is what the tokens' iss must be")
		}
		if err := c.checkURL("JWKSURL", c.JWKSURL); err != nil {
			return err
		}
	}
	if len(c.HS256Secret) > 0 || c.HS256Issuer != "" {
		switch {
		case len(c.HS256Secret) == 0:
			return setting.Errorf("HS256Issuer", c.HS256Issuer, "needs the secret too (--jwt-hs256-secret-file): without it no HS256 token can be verified")
		case len(c.HS256Secret) < MinHS256SecretBytes:
			return setting.Errorf("HS256Secret", fmt.Sprintf("(%d bytes)", len(c.HS256Secret)),
				"must be at least %d bytes: make one with `openssl rand -base64 48`", MinHS256SecretBytes)
		case c.HS256Issuer == "":
			return setting.Errorf("HS256Issuer", `""`, "is required with the HS256 secret: the iss your backend puts in its tokens, such as https://app.example/")
		case strings.Contains(c.HS256Issuer, "|"):
			return setting.Errorf("HS256Issuer", c.HS256Issuer, `must not contain "|": a user is named "<issuer>|<subject>"`)
		case c.HS256Issuer == c.Issuer:
			return setting.Errorf("HS256Issuer", c.HS256Issuer, "must differ from the OpenID Connect issuer: the provider's users and the backend's would be one")
		}
	}
	if c.Audience == "" {
		return setting.Errorf("Audience", `""`, "is required when JWTs are accepted: the aud your tokens carry (the API identifier of Auth0, the client id of Keycloak)")
	}
	if c.UserClaim == "" {
		return setting.Errorf("UserClaim", `""`, "must name a claim, such as sub")
	}
	for _, d := range []struct {
		field    string
		v, least time.Duration
	}{
		{"MinRefetch", c.MinRefetch, 10 * time.Millisecond},
		{"KeysMaxAge", c.KeysMaxAge, time.Second},
		{"FetchTimeout", c.FetchTimeout, 10 * time.Millisecond},
	} {
		if d.v < d.least {
			return setting.Errorf(d.field, d.v, "must be at least %s", d.least)
		}
	}
	if c.Leeway < 0 || c.Leeway > 5*time.Minute {
		return setting.Errorf("Leeway", c.Leeway, "must be between 0 and 5m")
	}
	if c.MaxResponseBytes < 1024 {
		return setting.Errorf("MaxResponseBytes", c.MaxResponseBytes, "must be at least 1024")
	}
	if c.MaxTokenBytes < 512 {
		return setting.Errorf("MaxTokenBytes", c.MaxTokenBytes, "must be at least 512")
	}
	return nil
}

// checkURL refuses a URL that is not absolute HTTPS (or HTTP with
// AllowHTTP), or that carries credentials.
func (c Config) checkURL(field, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return setting.Errorf(field, raw, "must be an absolute https:// URL")
	}
	if u.User != nil {
		return setting.Errorf(field, redactURL(u), "must not carry a user or password")
	}
	if u.Scheme == "http" && !c.AllowHTTP {
		return setting.Errorf(field, raw, "must use https://: plain HTTP lets anyone on the path swap the keys (--jwt-allow-http allows it for development)")
	}
	return nil
}

// redactURL is u without its user information.
func redactURL(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// KeySource says where the provider's keys come from, for the startup log
// and `baton status`.
func (c Config) KeySource() string {
	switch {
	case c.Issuer == "":
		return ""
	case c.JWKSURL != "":
		return c.JWKSURL
	}
	return "discovery: " + discoveryURL(c.Issuer)
}

// discoveryURL is where an issuer's OpenID Connect discovery document is.
func discoveryURL(issuer string) string {
	return strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
}
