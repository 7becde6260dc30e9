package jwtauth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// DefaultStepIssuer is the iss of a step token unless StepClaims.Issuer
// names another.
const DefaultStepIssuer = "baton"

// SigningKey signs the step tokens the worker sends to an external agent
// with each step request (Authorization: Bearer), so that the agent can
// tell that the call comes from Baton, and for which user, conversation,
// turn and step. It is an Ed25519 key; agents verify its tokens with the
// public half, which the API serves as a JWKS (PublicKeys). It is safe
// for concurrent use, and it never prints its key: %v shows its key id.
type SigningKey struct {
	key ed25519.PrivateKey
	kid string
	now func() time.Time
}

// LoadSigningKey reads an Ed25519 private key in PEM (PKCS #8,
// -----BEGIN PRIVATE KEY-----, as `baton agent-key create` and `openssl
// genpkey -algorithm ed25519` write it). The file must be closed to other
// users (mode 0600, or 0640 and 0440 for a service's group). Errors name
// the file and say how to fix it; none holds key material.
func LoadSigningKey(path string) (*SigningKey, error) {
	k, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	if k.private == nil {
		return nil, fmt.Errorf("%s holds a public key: the signing key is the private one (the file `baton agent-key create` wrote with --private-key)", path)
	}
	return newSigningKey(k.private)
}

func newSigningKey(key ed25519.PrivateKey) (*SigningKey, error) {
	kid, err := keyID(key.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	return &SigningKey{key: key, kid: kid, now: time.Now}, nil
}

// keyID is the key's RFC 7638 JWK thumbprint (SHA-256, base64url): the
// same for the key wherever it is computed, so an agent can check a kid
// against the public key it was given by hand.
func keyID(pub ed25519.PublicKey) (string, error) {
	sum, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}

// KeyID is the kid of the key's tokens and of its public key in the JWKS:
// its RFC 7638 thumbprint.
func (k *SigningKey) KeyID() string { return k.kid }

// String names the key by its id, never its material.
func (k SigningKey) String() string { return "Ed25519 signing key " + k.kid }

// GoString is String: %#v shows no key material either.
func (k SigningKey) GoString() string { return k.String() }

// StepClaims are what a step token says. Each is required unless it says
// otherwise.
type StepClaims struct {
	// Issuer is iss: who signed the token. Defaults to "baton".
	Issuer string
	// Audience is aud, one value: the agent the token is for, such as its
	// URL. An agent refuses a token of another audience, so a token that
	// one agent received cannot be replayed to another.
	Audience string
	// Subject is sub: the conversation's owner, as Baton names users (a
	// Baton token's user name, or "<iss>|<sub>" of a JWT's user).
	Subject string
	// Conversation is baton_conversation: the conversation's server key
	// (c_...), unique across owners; never the id its owner chose.
	Conversation string
	// Turn is baton_turn: the turn's id.
	Turn string
	// Step is baton_step: the step's key, the same for every post of this
	// step (an automatic retry, a re-claim), which an agent can take as
	// its idempotency key.
	Step string
	// Expiry is exp; the worker gives the deadline of its lease, past
	// which the step is no longer its own. It must be in the future (at a
	// whole second: exp counts seconds, rounded down).
	Expiry time.Time
}

// stepToken is the JSON of a step token's claims.
type stepToken struct {
	Issuer       string           `json:"iss"`
	Subject      string           `json:"sub"`
	Audience     string           `json:"aud"`
	IssuedAt     *jwt.NumericDate `json:"iat"`
	Expiry       *jwt.NumericDate `json:"exp"`
	ID           string           `json:"jti"`
	Conversation string           `json:"baton_conversation"`
	Turn         string           `json:"baton_turn"`
	Step         string           `json:"baton_step"`
}

// Sign returns a compact JWT of c: header alg EdDSA, typ JWT and the
// key's kid; claims iss, sub, aud, iat, exp, jti, baton_conversation,
// baton_turn and baton_step. Sign one token per request.
//
// There is no nbf: the token is valid from iat, and an agent whose clock
// runs a little behind would refuse a token that is not valid yet. jti is
// random, new for every token, never the step's key: an agent may refuse
// a jti it has seen (a replayed token) without refusing the worker's
// retry of the same step, which comes with a new token and the same
// baton_step.
func (k *SigningKey) Sign(c StepClaims) (string, error) {
	if c.Issuer == "" {
		c.Issuer = DefaultStepIssuer
	}
	for _, f := range []struct{ name, v string }{
		{"Audience", c.Audience}, {"Subject", c.Subject},
		{"Conversation", c.Conversation}, {"Turn", c.Turn}, {"Step", c.Step},
	} {
		if f.v == "" {
			return "", fmt.Errorf("jwtauth: a step token needs StepClaims.%s", f.name)
		}
	}
	now := k.now()
	if c.Expiry.Unix() <= now.Unix() {
		if c.Expiry.IsZero() {
			return "", errors.New("jwtauth: a step token needs StepClaims.Expiry: the deadline of the lease")
		}
		return "", fmt.Errorf("jwtauth: a step token's expiry must be in the future, at a whole second: %s is not after %s",
			c.Expiry.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339))
	}
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: k.key, KeyID: k.kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", err
	}
	return jwt.Signed(signer).Claims(stepToken{
		Issuer: c.Issuer, Subject: c.Subject, Audience: c.Audience,
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(c.Expiry),
		ID:           base64.RawURLEncoding.EncodeToString(jti),
		Conversation: c.Conversation, Turn: c.Turn, Step: c.Step,
	}).Serialize()
}
