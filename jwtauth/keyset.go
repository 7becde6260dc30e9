package jwtauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/rs/zerolog"
)

// minRSABits is the least size of an RSA key accepted from a JWKS.
const minRSABits = 2048

var (
	// errUnknownKey is a kid the fetched keys do not have.
	errUnknownKey = errors.New("unknown signing key")
	// errTooSoon is a fetch refused because the last one was less than
	// MinRefetch ago.
	errTooSoon = errors.New("the keys were fetched moments ago")
)

// keySet holds a provider's signing keys, fetched from its JWKS. A kid it
// does not know makes it fetch the set again, at most once per
// MinRefetch; keys older than KeysMaxAge are fetched again by the next
// token. A failed fetch leaves the keys as they were: those keep working
// and no other key does.
type keySet struct {
	cfg    Config
	log    zerolog.Logger
	client *http.Client
	now    func() time.Time

	mu sync.Mutex
	// jwksURL is the configured one, or the discovered one once
	// discovery succeeded.
	jwksURL string
	keys    []jose.JSONWebKey
	// fetchedAt is the last successful fetch, triedAt the last attempt.
	fetchedAt, triedAt time.Time
	lastErr            error
	// fetching is closed when the fetch under way ends; nil when none.
	fetching chan struct{}
}

func newKeySet(cfg Config, now func() time.Time) *keySet {
	k := &keySet{cfg: cfg, log: *cfg.Logger, now: now, jwksURL: cfg.JWKSURL}
	k.client = &http.Client{
		Transport: cfg.Transport,
		Timeout:   cfg.FetchTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("more than 3 redirects")
			}
			if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && cfg.AllowHTTP) {
				return fmt.Errorf("a redirect to %s, which is not HTTPS", redactURL(req.URL))
			}
			return nil
		},
	}
	return k
}

// key returns the key a token with this kid and algorithm is verified
// with. It fetches the keys when they are older than KeysMaxAge, or when
// none has the kid; either at most once per MinRefetch.
func (k *keySet) key(ctx context.Context, kid string, alg jose.SignatureAlgorithm) (jose.JSONWebKey, error) {
	k.mu.Lock()
	key, found := k.find(kid)
	stale := !k.fetchedAt.IsZero() && k.now().Sub(k.fetchedAt) >= k.cfg.KeysMaxAge
	k.mu.Unlock()
	if found && !stale {
		return k.check(key, alg)
	}
	err := k.refresh(ctx)
	k.mu.Lock()
	key, found = k.find(kid)
	k.mu.Unlock()
	switch {
	case found:
		// Fetched again, or kept because the fetch failed or came too
		// soon.
		return k.check(key, alg)
	case err != nil && !errors.Is(err, errTooSoon):
		return jose.JSONWebKey{}, fmt.Errorf("%w: the issuer's keys have no kid %q, and they could not be fetched again: %v", errUnknownKey, kid, err)
	}
	return jose.JSONWebKey{}, k.unknown(kid)
}

func (k *keySet) unknown(kid string) error {
	return fmt.Errorf("%w: the issuer's keys have no kid %q", errUnknownKey, kid)
}

// find returns the key with kid; a token without a kid takes the only
// key of a set of one. It expects k.mu held.
func (k *keySet) find(kid string) (jose.JSONWebKey, bool) {
	if kid == "" && len(k.keys) == 1 {
		return k.keys[0], true
	}
	for _, key := range k.keys {
		if key.KeyID == kid {
			return key, true
		}
	}
	return jose.JSONWebKey{}, false
}

// check refuses a key that does not go with the token's algorithm.
func (k *keySet) check(key jose.JSONWebKey, alg jose.SignatureAlgorithm) (jose.JSONWebKey, error) {
	if key.Algorithm != "" && key.Algorithm != string(alg) {
		return jose.JSONWebKey{}, fmt.Errorf("the key %q is for %s, not %s", key.KeyID, key.Algorithm, alg)
	}
	ok := false
	switch pub := key.Key.(type) {
	case *rsa.PublicKey:
		ok = alg == jose.RS256
	case *ecdsa.PublicKey:
		ok = alg == jose.ES256 && pub.Curve == elliptic.P256()
	case ed25519.PublicKey:
		ok = alg == jose.EdDSA
	}
	if !ok {
		return jose.JSONWebKey{}, fmt.Errorf("the key %q cannot verify %s", key.KeyID, alg)
	}
	return key, nil
}

// refresh fetches the keys, or waits for the fetch under way, or returns
// errTooSoon when the last one started less than MinRefetch ago. The fetch
// is not bound to ctx: a client that hangs up does not cut it short for
// the others waiting on it.
func (k *keySet) refresh(ctx context.Context) error {
	k.mu.Lock()
	if k.fetching != nil {
		fetching := k.fetching
		k.mu.Unlock()
		select {
		case <-fetching:
		case <-ctx.Done():
			return ctx.Err()
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.lastErr
	}
	if !k.triedAt.IsZero() && k.now().Sub(k.triedAt) < k.cfg.MinRefetch {
		k.mu.Unlock()
		return errTooSoon
	}
	done := make(chan struct{})
	k.fetching = done
	k.triedAt = k.now()
	jwksURL := k.jwksURL
	k.mu.Unlock()

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.FetchTimeout)
	defer cancel()
	keys, discovered, err := k.fetch(fctx, jwksURL)

	k.mu.Lock()
	defer k.mu.Unlock()
	if discovered != "" {
		k.jwksURL = discovered
	}
	if err == nil {
		k.keys, k.fetchedAt = keys, k.now()
		k.log.Info().Str("jwks_url", k.jwksURL).Int("keys", len(keys)).Msg("fetched the JWT issuer's keys")
	} else {
		k.log.Warn().Err(err).Str("issuer", k.cfg.Issuer).Int("keys_kept", len(k.keys)).
			Msg("cannot fetch the JWT issuer's keys; the keys fetched before keep working, tokens signed by any other key are refused")
	}
	k.lastErr = err
	k.fetching = nil
	close(done)
	return err
}

// fetch discovers the JWKS URL when it is not known yet, and fetches the
// keys from it.
func (k *keySet) fetch(ctx context.Context, jwksURL string) (keys []jose.JSONWebKey, discovered string, err error) {
	if jwksURL == "" {
		var doc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := k.getJSON(ctx, discoveryURL(k.cfg.Issuer), &doc); err != nil {
			return nil, "", fmt.Errorf("discovery: %w", err)
		}
		if doc.Issuer != k.cfg.Issuer {
			return nil, "", fmt.Errorf("discovery: the document is for issuer %q, not %q (set --jwt-issuer to exactly the iss of the tokens)", doc.Issuer, k.cfg.Issuer)
		}
		if err := k.cfg.checkURL("jwks_uri", doc.JWKSURI); err != nil {
			return nil, "", fmt.Errorf("discovery: %w", err)
		}
		jwksURL, discovered = doc.JWKSURI, doc.JWKSURI
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := k.getJSON(ctx, jwksURL, &set); err != nil {
		return nil, discovered, err
	}
	for _, raw := range set.Keys {
		if key, ok := signingKey(raw); ok {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil, discovered, fmt.Errorf("%s has no public signing key for %v", jwksURL, AsymmetricAlgorithms)
	}
	return keys, discovered, nil
}

// signingKey parses one key of a JWKS and keeps it when it can verify one
// of AsymmetricAlgorithms: a public RSA key of at least 2048 bits, a P-256
// key or an Ed25519 key, not marked for encryption. Symmetric keys are
// never taken from a JWKS.
func signingKey(raw json.RawMessage) (jose.JSONWebKey, bool) {
	var key jose.JSONWebKey
	if err := key.UnmarshalJSON(raw); err != nil {
		return key, false
	}
	if key.Use != "" && key.Use != "sig" {
		return key, false
	}
	if key.Algorithm != "" && !slices.Contains(AsymmetricAlgorithms, jose.SignatureAlgorithm(key.Algorithm)) {
		return key, false
	}
	if !key.IsPublic() {
		// Whatever private part a careless provider published is dropped.
		key = key.Public()
	}
	switch pub := key.Key.(type) {
	case *rsa.PublicKey:
		return key, pub.N.BitLen() >= minRSABits
	case *ecdsa.PublicKey:
		return key, pub.Curve == elliptic.P256()
	case ed25519.PublicKey:
		return key, true
	}
	return key, false
}

// getJSON GETs u and decodes its JSON answer into v: 200 only, at most
// MaxResponseBytes.
func (k *keySet) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("GET %s: no answer within %s", u, k.cfg.FetchTimeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			// The URL is said apart; the error's own text is enough.
			err = ue.Err
		}
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if resp.ContentLength > int64(k.cfg.MaxResponseBytes) {
		return fmt.Errorf("GET %s: the answer is %d bytes, over the limit of %d", u, resp.ContentLength, k.cfg.MaxResponseBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(k.cfg.MaxResponseBytes)+1))
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("GET %s: the answer did not end within %s", u, k.cfg.FetchTimeout)
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if len(body) > k.cfg.MaxResponseBytes {
		return fmt.Errorf("GET %s: the answer is over the limit of %d bytes", u, k.cfg.MaxResponseBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: the answer is not the JSON expected: %v", u, err)
	}
	return nil
}

// state is what the key set knows, for status.
func (k *keySet) state() (jwksURL string, keys int, fetchedAt time.Time, lastErr error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.jwksURL, len(k.keys), k.fetchedAt, k.lastErr
}
