package jwtauth

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/oidctest"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const (
	audience    = "https://api.baton.test"
	hs256Issuer = "https://backend.example/"
)

// bundle is a verifier of the tokens of a key server the test controls,
// and of HS256 tokens, on a clock the test moves.
type bundle struct {
	ks     *oidctest.KeyServer
	rsa    *oidctest.Key
	secret []byte
	v      *Verifier
	mu     sync.Mutex
	now    time.Time
}

func setup(t *testing.T, configure ...func(*Config)) *bundle {
	t.Helper()
	b := &bundle{ks: oidctest.NewKeyServer(t), now: time.Now(), secret: []byte(strings.Repeat("s3cr3t-", 6))}
	b.rsa = b.ks.NewPublishedKey(t, jose.RS256)
	cfg := Config{
		Issuer: b.ks.Issuer, Audience: audience, AllowHTTP: true,
		HS256Secret: b.secret, HS256Issuer: hs256Issuer,
		MinRefetch: time.Minute, FetchTimeout: 2 * time.Second,
	}
	for _, f := range configure {
		f(&cfg)
	}
	v, err := New(cfg)
	require.NoError(t, err)
	v.now = b.clock
	b.v = v
	return b
}

func (b *bundle) clock() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

func (b *bundle) advance(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = b.now.Add(d)
}

// claims are valid claims of the key server's issuer for sub.
func (b *bundle) claims(sub string) map[string]any {
	c := oidctest.Claims(b.ks.Issuer, sub, audience, 5*time.Minute)
	c["iat"], c["exp"] = b.clock().Unix(), b.clock().Add(5*time.Minute).Unix()
	return c
}

func (b *bundle) verify(token string) (Identity, error) {
	return b.v.Verify(context.Background(), token)
}

func (b *bundle) requireAccepted(t *testing.T, token, what string) Identity {
	t.Helper()
	id, err := b.verify(token)
	require.NoError(t, err, "%s should be accepted", what)
	return id
}

func (b *bundle) requireRefused(t *testing.T, token, what, why string) {
	t.Helper()
	_, err := b.verify(token)
	require.Error(t, err, "%s should be refused", what)
	var refusal *Error
	require.True(t, errors.As(err, &refusal), "%s: a refusal is an *Error, not %T", what, err)
	require.Contains(t, err.Error(), why, "%s: the reason", what)
}

func TestEachAcceptedAlgorithmVerifiesAndNamesTheUserByIssuerAndSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := []*oidctest.Key{b.rsa, oidctest.NewKey(t, jose.ES256), oidctest.NewKey(t, jose.EdDSA)}
	b.ks.Publish(keys[1])
	b.ks.Publish(keys[2])
	for _, k := range keys {
		id := b.requireAccepted(t, k.Sign(t, b.claims("auth0|64f1c2")), string(k.Alg))
		require.Equal(t, b.ks.Issuer+"|auth0|64f1c2", id.UserName(), "a %s token's user is <iss>|<sub>", k.Alg)
	}
	id := b.requireAccepted(t, oidctest.HS256(t, b.secret, oidctest.Claims(hs256Issuer, "auth0|64f1c2", audience, time.Minute)), "HS256")
	require.Equal(t, hs256Issuer+"|auth0|64f1c2", id.UserName(), "the same sub from the HS256 issuer is another user")
}

func TestEveryForgedOrInvalidTokenIsRefusedWithItsReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := b.rsa.Sign(t, b.claims("alice"))
	b.requireAccepted(t, good, "the control token")

	pubDER, err := x509.MarshalPKIXPublicKey(b.rsa.JWK.Key)
	require.NoError(t, err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	pubJWK, err := json.Marshal(b.rsa.JWK)
	require.NoError(t, err)
	rs384 := *b.rsa
	rs384.Alg = jose.RS384
	stranger := oidctest.NewKey(t, jose.RS256)
	with := func(change func(map[string]any)) map[string]any {
		c := b.claims("alice")
		change(c)
		return c
	}
	at := func(d time.Duration) int64 { return b.clock().Add(d).Unix() }

	for _, tc := range []struct{ name, token, why string }{
		{"alg none", oidctest.None(t, b.claims("alice")), "algorithm this server accepts"},
		{"HS256 signed with the provider's public key (PEM)", oidctest.HMAC(t, pubPEM, b.claims("alice")), "signature does not verify"},
		{"HS256 signed with the provider's public key (JWK)", oidctest.HMAC(t, pubJWK, b.claims("alice")), "signature does not verify"},
		{"RS384, not in the list", rs384.Sign(t, b.claims("alice")), "algorithm this server accepts"},
		{"wrong issuer", b.rsa.Sign(t, with(func(c map[string]any) { c["iss"] = "https://evil.example/" })), "iss must be"},
		{"HS256 claiming the provider's issuer", oidctest.HS256(t, b.secret, b.claims("alice")), "HS256 token's iss must be"},
		{"wrong audience", b.rsa.Sign(t, with(func(c map[string]any) { c["aud"] = "https://other.api" })), "aud must include"},
		{"HS256 with the wrong audience", oidctest.HS256(t, b.secret, oidctest.Claims(hs256Issuer, "alice", "https://other.api", time.Minute)), "aud must include"},
		{"no exp", b.rsa.Sign(t, with(func(c map[string]any) { delete(c, "exp") })), "no exp"},
		{"expired past the leeway", b.rsa.Sign(t, with(func(c map[string]any) { c["exp"] = at(-DefaultLeeway - time.Second) })), "expired"},
		{"not valid yet", b.rsa.Sign(t, with(func(c map[string]any) { c["nbf"] = at(DefaultLeeway + time.Minute) })), "not valid yet"},
		{"issued in the future", b.rsa.Sign(t, with(func(c map[string]any) { c["iat"] = at(DefaultLeeway + time.Minute) })), "issued in the future"},
		{"changed payload", oidctest.WithPayload(t, good, b.claims("mallory")), "signature does not verify"},
		{"signed by a stranger under a known kid", stranger.SignAs(t, b.rsa.KID, b.claims("alice")), "signature does not verify"},
		{"oversized", b.rsa.Sign(t, with(func(c map[string]any) { c["pad"] = strings.Repeat("x", DefaultMaxTokenBytes) })), "over the limit"},
		{"no sub", b.rsa.Sign(t, with(func(c map[string]any) { delete(c, "sub") })), "no sub claim"},
		{"sub not a string", b.rsa.Sign(t, with(func(c map[string]any) { c["sub"] = 42 })), "no sub claim"},
		{"sub with a control character", b.rsa.Sign(t, with(func(c map[string]any) { c["sub"] = "a\nb" })), "control characters"},
		{"a user name past the bound", b.rsa.Sign(t, with(func(c map[string]any) { c["sub"] = strings.Repeat("é", MaxUserNameLength) })), "over the limit of 512"},
	} {
		b.requireRefused(t, tc.token, tc.name, tc.why)
	}
	b.requireAccepted(t, b.rsa.Sign(t, with(func(c map[string]any) { c["exp"] = at(-DefaultLeeway + 5*time.Second) })), "a token expired within the leeway")
}

func TestHS256IsRefusedWhenNoSecretIsConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.HS256Secret, c.HS256Issuer = nil, "" })
	pubJWK, err := json.Marshal(b.rsa.JWK)
	require.NoError(t, err)
	b.requireRefused(t, oidctest.HMAC(t, pubJWK, b.claims("alice")), "HS256 with the public key", "algorithm this server accepts")
	b.requireRefused(t, oidctest.HS256(t, b.secret, oidctest.Claims(hs256Issuer, "alice", audience, time.Minute)), "HS256 with a secret", "algorithm this server accepts")
}

func TestAnUnknownKidFetchesTheKeysAgainAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.requireAccepted(t, b.rsa.Sign(t, b.claims("alice")), "a token of the first key")
	require.EqualValues(t, 1, b.ks.JWKSHits.Load(), "the first token fetches the keys")

	rotated := b.ks.NewPublishedKey(t, jose.RS256)
	b.requireRefused(t, rotated.Sign(t, b.claims("alice")), "a new key moments after the fetch", "have no kid")
	require.EqualValues(t, 1, b.ks.JWKSHits.Load(), "no fetch sooner than MinRefetch after the last")

	b.advance(time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.verify(rotated.Sign(t, b.claims("alice")))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a rotated key is picked up once MinRefetch passed")
	}
	require.EqualValues(t, 2, b.ks.JWKSHits.Load(), "ten tokens of the new key at once cause one fetch")

	for range 20 {
		b.requireRefused(t, oidctest.NewKey(t, jose.RS256).Sign(t, b.claims("alice")), "a token of a kid nobody publishes", "have no kid")
	}
	require.EqualValues(t, 2, b.ks.JWKSHits.Load(), "a flood of unknown kids causes no fetch within MinRefetch")
	b.advance(time.Minute)
	b.requireRefused(t, oidctest.NewKey(t, jose.RS256).Sign(t, b.claims("alice")), "a token of a kid nobody publishes", "have no kid")
	require.EqualValues(t, 3, b.ks.JWKSHits.Load(), "one fetch per MinRefetch")
}

func TestKnownKeysKeepWorkingWhileTheJWKSIsDownAndNoOtherKeyDoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.requireAccepted(t, b.rsa.Sign(t, b.claims("alice")), "a token of the published key")
	b.ks.SetMode(oidctest.Down)
	rotated := b.ks.NewPublishedKey(t, jose.RS256)
	b.advance(DefaultKeysMaxAge + time.Minute)

	hits := b.ks.JWKSHits.Load()
	b.requireRefused(t, rotated.Sign(t, b.claims("alice")), "a token of a key the JWKS publishes while it is down", "could not be fetched again")
	require.Equal(t, hits+1, b.ks.JWKSHits.Load(), "the unknown kid tried a fetch")
	b.requireAccepted(t, b.rsa.Sign(t, b.claims("alice")), "a token of a key fetched before, with the JWKS down and the keys past their age")
	b.requireRefused(t, b.rsa.SignAs(t, "kid-nobody-has", b.claims("alice")), "a token of a known key under an unknown kid", "have no kid")

	b.ks.SetMode(oidctest.Serving)
	b.advance(time.Minute)
	b.requireAccepted(t, rotated.Sign(t, b.claims("alice")), "the new key once the JWKS is back")
}

func TestAJWKSAnswerOverTheSizeLimitIsRefusedWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rotated := b.ks.NewPublishedKey(t, jose.RS256)
	b.ks.SetOversized(DefaultMaxResponseBytes)
	b.requireRefused(t, rotated.Sign(t, b.claims("alice")), "a token of a key in an oversized JWKS", "over the limit of 65536 bytes")
	require.EqualValues(t, 1, b.ks.JWKSHits.Load())

	b.ks.SetOversized(DefaultMaxResponseBytes - 4096)
	b.advance(time.Minute)
	b.requireAccepted(t, rotated.Sign(t, b.claims("alice")), "the same key in an answer under the limit")
}

func TestAFetchThatHangsEndsAtTheTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.FetchTimeout = 300 * time.Millisecond })
	b.ks.SetMode(oidctest.Hanging)
	start := time.Now()
	b.requireRefused(t, b.rsa.Sign(t, b.claims("alice")), "a token while the JWKS hangs", "no answer within 300ms")
	require.Less(t, time.Since(start), 10*time.Second, "the fetch gives up at its timeout (300ms), not when the provider answers")
}

func TestPlainHTTPIsRefusedUnlessAllowed(t *testing.T) {
	t.Parallel()
	err := Config{Issuer: "http://idp.example/", Audience: audience}.WithDefaults().Validate()
	require.ErrorContains(t, err, "--jwt-allow-http", "a plain HTTP issuer needs AllowHTTP")
	err = Config{Issuer: "https://idp.example/", JWKSURL: "http://idp.example/jwks", Audience: audience}.WithDefaults().Validate()
	require.ErrorContains(t, err, "--jwt-allow-http", "a plain HTTP JWKS URL needs AllowHTTP")

	// Discovery over HTTPS that names a plain HTTP JWKS.
	ks := oidctest.NewTLSKeyServer(t)
	key := ks.NewPublishedKey(t, jose.RS256)
	ks.SetDiscoveredJWKSURI("http://" + strings.TrimPrefix(ks.JWKSURL, "https://"))
	v, err := New(Config{Issuer: ks.Issuer, Audience: audience, Transport: ks.Server.Client().Transport})
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), key.Sign(t, oidctest.Claims(ks.Issuer, "alice", audience, time.Minute)))
	require.ErrorContains(t, err, "must use https://", "a discovered plain HTTP jwks_uri is refused")
	require.Zero(t, ks.JWKSHits.Load(), "nothing was fetched over plain HTTP")

	ks.SetDiscoveredJWKSURI(ks.JWKSURL)
	v, err = New(Config{Issuer: ks.Issuer, Audience: audience, Transport: ks.Server.Client().Transport})
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), key.Sign(t, oidctest.Claims(ks.Issuer, "alice", audience, time.Minute)))
	require.NoError(t, err, "the same issuer with an HTTPS jwks_uri")
}

func TestKeysOlderThanMaxAgeAreFetchedAgainSoAWithdrawnKeyStopsWorking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.requireAccepted(t, b.rsa.Sign(t, b.claims("alice")), "a token of the published key")
	b.ks.NewPublishedKey(t, jose.RS256)
	b.ks.Withdraw(b.rsa.KID)
	b.advance(DefaultKeysMaxAge - time.Second)
	b.requireAccepted(t, b.rsa.Sign(t, b.claims("alice")), "a withdrawn key before the keys' age")
	b.advance(2 * time.Second)
	b.requireRefused(t, b.rsa.Sign(t, b.claims("alice")), "a withdrawn key once the keys were fetched again", "have no kid")
}

func TestDiscoveryOfAnotherIssuerIsRefused(t *testing.T) {
	t.Parallel()
	ks := oidctest.NewKeyServer(t)
	key := ks.NewPublishedKey(t, jose.RS256)
	// Without Auth0's trailing slash: the discovery document says
	// otherwise, and so would every token.
	issuer := strings.TrimSuffix(ks.Issuer, "/")
	v, err := New(Config{Issuer: issuer, Audience: audience, AllowHTTP: true})
	require.NoError(t, err)
	_, err = v.Verify(context.Background(), key.Sign(t, oidctest.Claims(issuer, "alice", audience, time.Minute)))
	require.ErrorContains(t, err, "set --jwt-issuer to exactly the iss")
	st := v.Fetch(context.Background())
	require.Error(t, st.Err, "Fetch reports why the keys cannot be had")
}

func TestTheUserClaimFlagNamesTheUser(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.UserClaim = "email" })
	c := b.claims("user_2abc")
	c["email"] = "ada@example.com"
	id := b.requireAccepted(t, b.rsa.Sign(t, c), "a token with the user claim")
	require.Equal(t, b.ks.Issuer+"|ada@example.com", id.UserName())
	b.requireRefused(t, b.rsa.Sign(t, b.claims("user_2abc")), "a token without the user claim", "no email claim")
}

func TestConfigRefusesWhatCannotWorkAndNeverShowsTheSecret(t *testing.T) {
	t.Parallel()
	secret := []byte("short-but-secret-value")
	long := []byte(strings.Repeat("k", 40))
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string
	}{
		{"an issuer with |", Config{Issuer: "https://a|b.example/", Audience: audience}, "Issuer"},
		{"an HS256 issuer with |", Config{HS256Secret: long, HS256Issuer: "app|x", Audience: audience}, "HS256Issuer"},
		{"HS256 without its issuer", Config{HS256Secret: long, Audience: audience}, "HS256Issuer"},
		{"an HS256 issuer without the secret", Config{HS256Issuer: hs256Issuer, Audience: audience}, "HS256Issuer"},
		{"the same issuer for both", Config{Issuer: hs256Issuer, HS256Secret: long, HS256Issuer: hs256Issuer, Audience: audience}, "HS256Issuer"},
		{"a short secret", Config{HS256Secret: secret, HS256Issuer: hs256Issuer, Audience: audience}, "HS256Secret"},
		{"no audience", Config{Issuer: "https://idp.example/"}, "Audience"},
		{"no audience with HS256", Config{HS256Secret: long, HS256Issuer: hs256Issuer}, "Audience"},
		{"a JWKS URL without the issuer", Config{JWKSURL: "https://idp.example/jwks", Audience: audience}, "JWKSURL"},
		{"an issuer that is not a URL", Config{Issuer: "idp.example", Audience: audience}, "Issuer"},
		{"a JWKS URL with a password", Config{Issuer: "https://idp.example/", JWKSURL: "https://u:pw@idp.example/jwks", Audience: audience}, "JWKSURL"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		var se *setting.Error
		require.True(t, errors.As(err, &se), "%s: want a *setting.Error, got %v", tc.name, err)
		require.Equal(t, tc.field, se.Field, "%s: %v", tc.name, err)
		require.NotContains(t, err.Error(), string(secret), "%s: the error shows the secret", tc.name)
		require.NotContains(t, err.Error(), "pw@", "%s: the error shows a password", tc.name)
	}
	v, err := New(Config{})
	require.NoError(t, err)
	require.Nil(t, v, "a zero Config accepts no JWT")
}
