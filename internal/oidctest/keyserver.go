package oidctest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"
)

// KeyMode is how a KeyServer answers for its JWKS.
type KeyMode int

const (
	// Serving answers with the published keys.
	Serving KeyMode = iota
	// Down answers 503 to everything, discovery included.
	Down
	// Oversized answers with the published keys padded past Padding
	// bytes.
	Oversized
	// Hanging holds every request until it is set back or the server
	// closes.
	Hanging
)

// KeyServer is an issuer whose discovery document and JWKS a test
// controls, over plain HTTP (or HTTPS with NewTLSKeyServer).
type KeyServer struct {
	// Issuer is its issuer: its URL with a slash at the end, as Auth0's.
	Issuer string
	// JWKSURL is where its keys are.
	JWKSURL string
	// Server is the HTTP server.
	Server *httptest.Server

	// JWKSHits counts the requests for the JWKS; DiscoveryHits those for
	// the discovery document.
	JWKSHits, DiscoveryHits atomic.Int64

	mu sync.Mutex
	// jwksURI is what discovery says; the real JWKSURL unless a test
	// changes it.
	jwksURI   string
	published []jose.JSONWebKey
	mode      KeyMode
	padding   int
	release   chan struct{}
	// upstream is a JWKS whose keys are served before the published ones.
	upstream string
}

// NewKeyServer starts a KeyServer over plain HTTP; it stops when t ends.
func NewKeyServer(t testing.TB) *KeyServer {
	return newKeyServer(t, httptest.NewServer)
}

// NewTLSKeyServer starts a KeyServer over HTTPS with a certificate of
// httptest's own (its Server.Client() trusts it).
func NewTLSKeyServer(t testing.TB) *KeyServer {
	return newKeyServer(t, httptest.NewTLSServer)
}

func newKeyServer(t testing.TB, start func(http.Handler) *httptest.Server) *KeyServer {
	t.Helper()
	s := &KeyServer{release: make(chan struct{})}
	s.Server = start(http.HandlerFunc(s.serve))
	s.Issuer = s.Server.URL + "/"
	s.JWKSURL = s.Server.URL + "/jwks"
	s.jwksURI = s.JWKSURL
	t.Cleanup(func() {
		s.SetMode(Serving)
		s.Server.Close()
	})
	return s
}

func (s *KeyServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	mode, release, padding := s.mode, s.release, s.padding
	keys := append([]jose.JSONWebKey(nil), s.published...)
	jwksURI, upstream := s.jwksURI, s.upstream
	s.mu.Unlock()
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		s.DiscoveryHits.Add(1)
	case "/jwks":
		s.JWKSHits.Add(1)
	default:
		http.NotFound(w, r)
		return
	}
	switch mode {
	case Down:
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	case Hanging:
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != "/jwks" {
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": s.Issuer, "jwks_uri": jwksURI})
		return
	}
	if upstream != "" {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, upstream, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Close = true // no idle connection outlives the test
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		var set jose.JSONWebKeySet
		err = json.NewDecoder(resp.Body).Decode(&set)
		resp.Body.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		keys = append(set.Keys, keys...)
	}
	body := map[string]any{"keys": keys}
	if mode == Oversized {
		// A provider's answer that grew past any reason: the keys are
		// there, with this much beside them.
		body["padding"] = strings.Repeat("x", padding)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// SetMode changes how the server answers from the next request on.
func (s *KeyServer) SetMode(m KeyMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == Hanging && m != Hanging {
		close(s.release)
		s.release = make(chan struct{})
	}
	s.mode = m
}

// SetOversized makes the JWKS answer at least n bytes.
func (s *KeyServer) SetOversized(n int) {
	s.mu.Lock()
	s.padding = n
	s.mu.Unlock()
	s.SetMode(Oversized)
}

// Mirror makes the server's JWKS the keys of the JWKS at upstream (a real
// provider's), fetched at each request, and then its own published keys:
// a JWKS URL in front of a provider that a test can take down or swell.
func (s *KeyServer) Mirror(upstream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.upstream = upstream
}

// SetDiscoveredJWKSURI makes discovery name u as the JWKS.
func (s *KeyServer) SetDiscoveredJWKSURI(u string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jwksURI = u
}

// Key is a private signing key of a KeyServer (or of nobody).
type Key struct {
	Alg jose.SignatureAlgorithm
	KID string
	// Private is the private key.
	Private crypto.Signer
	// JWK is the public key as a JWKS lists it.
	JWK jose.JSONWebKey
}

// NewKey makes a key for alg (RS256, ES256 or EdDSA) that nobody
// publishes yet.
func NewKey(t testing.TB, alg jose.SignatureAlgorithm) *Key {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch alg {
	case jose.RS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("oidctest: no key for %s", alg)
	}
	require.NoError(t, err)
	kid := randomID(t)
	return &Key{Alg: alg, KID: kid, Private: priv,
		JWK: jose.JSONWebKey{Key: priv.Public(), KeyID: kid, Algorithm: string(alg), Use: "sig"}}
}

// Publish adds k to the JWKS.
func (s *KeyServer) Publish(k *Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.published = append(s.published, k.JWK)
}

// Withdraw removes the key with kid from the JWKS.
func (s *KeyServer) Withdraw(kid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kept []jose.JSONWebKey
	for _, k := range s.published {
		if k.KeyID != kid {
			kept = append(kept, k)
		}
	}
	s.published = kept
}

// NewPublishedKey makes a key for alg and publishes it.
func (s *KeyServer) NewPublishedKey(t testing.TB, alg jose.SignatureAlgorithm) *Key {
	k := NewKey(t, alg)
	s.Publish(k)
	return k
}

// Sign signs claims with k, its kid in the header.
func (k *Key) Sign(t testing.TB, claims map[string]any) string {
	return k.SignAs(t, k.KID, claims)
}

// SignAs signs claims with k but names kid in the header.
func (k *Key) SignAs(t testing.TB, kid string, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Alg, Key: jose.JSONWebKey{Key: k.Private, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	require.NoError(t, err)
	return tok
}

// Claims are the claims of a token of iss for sub with audience aud,
// issued now and expiring in ttl.
func Claims(iss, sub, aud string, ttl time.Duration) map[string]any {
	now := time.Now()
	return map[string]any{"iss": iss, "sub": sub, "aud": aud, "iat": now.Unix(), "exp": now.Add(ttl).Unix()}
}

// HS256 signs claims with secret, as a backend mints its own tokens.
func HS256(t testing.TB, secret []byte, claims map[string]any) string {
	t.Helper()
	return HMAC(t, secret, claims)
}

// HMAC builds an HS256 token by hand with any bytes as the key, such as
// a provider's public key (which no library would take as a secret): the
// algorithm confusion a verifier must refuse.
func HMAC(t testing.TB, key []byte, claims map[string]any) string {
	t.Helper()
	signing := segment(t, map[string]any{"alg": "HS256", "typ": "JWT"}) + "." + segment(t, claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// None builds an unsigned token, "alg": "none".
func None(t testing.TB, claims map[string]any) string {
	t.Helper()
	return segment(t, map[string]any{"alg": "none", "typ": "JWT"}) + "." + segment(t, claims) + "."
}

// WithPayload returns token with its payload replaced by claims and its
// signature kept: a changed payload.
func WithPayload(t testing.TB, token string, claims map[string]any) string {
	t.Helper()
	parts := strings.Split(token, ".")
	require.Len(t, parts, 3)
	return parts[0] + "." + segment(t, claims) + "." + parts[2]
}

// Payload decodes a token's claims without verifying them.
func Payload(t testing.TB, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	require.Len(t, parts, 3)
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var claims map[string]any
	require.NoError(t, json.Unmarshal(raw, &claims))
	return claims
}

func segment(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)
}

func randomID(t testing.TB) string {
	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)
}
