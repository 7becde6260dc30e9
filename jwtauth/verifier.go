package jwtauth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/batonhq/baton/schema"
)

// MaxUserNameLength is the longest user name, in characters, that a
// token may make: "<iss>|<user claim>". It is the bound of users.name.
const MaxUserNameLength = schema.MaxUserNameLength

// Identity is who a verified token names.
type Identity struct {
	// Issuer is the token's verified iss.
	Issuer string
	// Subject is the value of the user claim.
	Subject string
	// Expiry is the token's exp.
	Expiry time.Time
	// Claims are all of the token's verified claims.
	Claims map[string]any
}

// HasClaim reports whether the token's claim name holds value: a string
// equal to it, or an array with an element equal to it. A name with dots
// that no claim has whole is a path into nested objects
// ("realm_access.roles", as Keycloak puts roles).
func (id Identity) HasClaim(name, value string) bool {
	v, ok := id.Claims[name]
	if !ok {
		var cur any = map[string]any(id.Claims)
		for _, part := range strings.Split(name, ".") {
			m, isMap := cur.(map[string]any)
			if !isMap {
				return false
			}
			if cur, ok = m[part]; !ok {
				return false
			}
		}
		v = cur
	}
	switch v := v.(type) {
	case string:
		return v == value
	case []any:
		for _, e := range v {
			if s, isString := e.(string); isString && s == value {
				return true
			}
		}
	}
	return false
}

// UserName is the name of the token's user: "<iss>|<user claim>".
func (id Identity) UserName() string { return UserName(id.Issuer, id.Subject) }

// UserName is the name of the user a token of issuer with the user claim
// subject belongs to. The configuration refuses issuers that contain
// "|", so the name says which issuer and which subject it is made of.
func UserName(issuer, subject string) string { return issuer + "|" + subject }

// Error is why a token is refused. Its message says what is wrong with
// the token without repeating it, and is meant for the client.
type Error struct{ msg string }

func (e *Error) Error() string { return e.msg }

func refused(format string, args ...any) *Error { return &Error{msg: fmt.Sprintf(format, args...)} }

// Verifier verifies tokens as its Config says. It is safe for concurrent
// use.
type Verifier struct {
	cfg  Config
	algs []jose.SignatureAlgorithm
	keys *keySet
	now  func() time.Time
}

// New returns a Verifier, or nil when cfg accepts no JWT.
func New(cfg Config) (*Verifier, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, nil
	}
	v := &Verifier{cfg: cfg, now: time.Now}
	if cfg.Issuer != "" {
		v.algs = append(v.algs, AsymmetricAlgorithms...)
		v.keys = newKeySet(cfg, func() time.Time { return v.now() })
	}
	if len(cfg.HS256Secret) > 0 {
		v.algs = append(v.algs, jose.HS256)
	}
	return v, nil
}

// Config returns the configuration in use, defaults applied.
func (v *Verifier) Config() Config { return v.cfg }

// LooksLikeJWT reports whether token has the shape of a compact JWS
// (three dot-separated parts), as opposed to a Baton token.
func LooksLikeJWT(token string) bool { return strings.Count(token, ".") == 2 }

// Verify checks a token's size, algorithm, signature, issuer, audience,
// exp (required), nbf and iat, and its user claim, and returns who it
// names. A refused token is an *Error.
func (v *Verifier) Verify(ctx context.Context, token string) (Identity, error) {
	if len(token) > v.cfg.MaxTokenBytes {
		return Identity{}, refused("the token is %d bytes, over the limit of %d", len(token), v.cfg.MaxTokenBytes)
	}
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		return Identity{}, refused("the token is not a JWT signed with an algorithm this server accepts (%s)", v.accepted())
	}
	if len(tok.Headers) != 1 {
		return Identity{}, refused("the token must have exactly one signature")
	}
	h := tok.Headers[0]
	alg := jose.SignatureAlgorithm(h.Algorithm)
	var (
		key    any
		wantIs string
	)
	if alg == jose.HS256 {
		// Only the shared secret, never a key of the JWKS: a provider's
		// public key is no secret, and a token "signed" with it must not
		// pass (algorithm confusion).
		key, wantIs = v.cfg.HS256Secret, v.cfg.HS256Issuer
	} else {
		jwk, err := v.keys.key(ctx, h.KeyID, alg)
		if err != nil {
			return Identity{}, refused("the token's signing key is not one of the issuer's: %v", err)
		}
		key, wantIs = jwk.Key, v.cfg.Issuer
	}
	var all map[string]any
	if err := tok.Claims(key, &all); err != nil {
		return Identity{}, refused("the token's signature does not verify")
	}
	// The registered claims this server checks, read apart from the
	// user claim so that a sub of another type is said as such.
	var reg struct {
		Issuer    string           `json:"iss"`
		Audience  jwt.Audience     `json:"aud"`
		Expiry    *jwt.NumericDate `json:"exp"`
		NotBefore *jwt.NumericDate `json:"nbf"`
		IssuedAt  *jwt.NumericDate `json:"iat"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&reg); err != nil {
		return Identity{}, refused("the token's iss, aud, exp, nbf or iat is malformed: %v", err)
	}
	std := jwt.Claims{Issuer: reg.Issuer, Audience: reg.Audience, Expiry: reg.Expiry, NotBefore: reg.NotBefore, IssuedAt: reg.IssuedAt}
	if std.Expiry == nil {
		return Identity{}, refused("the token has no exp: give it an expiry")
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: wantIs, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: v.now()}, v.cfg.Leeway)
	switch {
	case errors.Is(err, jwt.ErrInvalidIssuer):
		if alg == jose.HS256 {
			return Identity{}, refused("an HS256 token's iss must be %q", wantIs)
		}
		return Identity{}, refused("the token's iss must be %q", wantIs)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return Identity{}, refused("the token's aud must include %q", v.cfg.Audience)
	case errors.Is(err, jwt.ErrExpired):
		return Identity{}, refused("the token expired: get a new one from the issuer")
	case errors.Is(err, jwt.ErrNotValidYet):
		return Identity{}, refused("the token is not valid yet (nbf)")
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, refused("the token was issued in the future (iat): check the issuer's clock")
	case err != nil:
		return Identity{}, refused("the token's claims are not valid: %v", err)
	}
	subject, ok := all[v.cfg.UserClaim].(string)
	if !ok || subject == "" {
		return Identity{}, refused("the token has no %s claim that is a non-empty string", v.cfg.UserClaim)
	}
	if strings.IndexFunc(subject, unicode.IsControl) >= 0 {
		return Identity{}, refused("the token's %s claim holds control characters", v.cfg.UserClaim)
	}
	id := Identity{Issuer: std.Issuer, Subject: subject, Expiry: std.Expiry.Time(), Claims: all}
	if n := utf8.RuneCountInString(id.UserName()); n > MaxUserNameLength {
		return Identity{}, refused("the token's issuer and %s claim make a user name of %d characters, over the limit of %d", v.cfg.UserClaim, n, MaxUserNameLength)
	}
	return id, nil
}

// accepted lists the algorithms accepted, and from whom.
func (v *Verifier) accepted() string {
	var parts []string
	if v.cfg.Issuer != "" {
		parts = append(parts, "RS256, ES256 or EdDSA from "+v.cfg.Issuer)
	}
	if len(v.cfg.HS256Secret) > 0 {
		parts = append(parts, "HS256 from "+v.cfg.HS256Issuer)
	}
	return strings.Join(parts, "; ")
}

// KeyState is what the verifier knows of the provider's keys.
type KeyState struct {
	// JWKSURL is the configured or discovered JWKS; empty until
	// discovery succeeded.
	JWKSURL string
	// Keys is how many signing keys are in use.
	Keys int
	// FetchedAt is the last successful fetch; zero before one.
	FetchedAt time.Time
	// Err is why the last fetch failed; nil when it succeeded.
	Err error
}

// Fetch fetches the provider's keys now, unless they were fetched less
// than MinRefetch ago, and says what the verifier knows. The API calls it
// at start so that its log says whether the keys can be had; status calls
// it to show them. Without a provider it returns a zero KeyState.
func (v *Verifier) Fetch(ctx context.Context) KeyState {
	if v.keys == nil {
		return KeyState{}
	}
	_ = v.keys.refresh(ctx)
	var s KeyState
	s.JWKSURL, s.Keys, s.FetchedAt, s.Err = v.keys.state()
	return s
}
