package api_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/oidctest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

const (
	jwtAudience    = "https://api.baton.test"
	hs256Issuer    = "https://backend.example/"
	hs256SecretLen = 48
)

// jwtBundle is the API with live events that accepts the tokens of a real
// OpenID Connect provider (oidc-provider, a child process) and HS256
// tokens of a backend, beside Baton's own.
type jwtBundle struct {
	*bundle
	provider *oidctest.Provider
	secret   []byte
	api      *api.Server
}

func jwtSetup(t *testing.T, provider *oidctest.Provider, configure func(*jwtauth.Config)) *jwtBundle {
	t.Helper()
	secret := []byte(strings.Repeat("0123456789abcdef", 3))[:hs256SecretLen]
	cfg := jwtauth.Config{
		Issuer: provider.Issuer, Audience: jwtAudience, AllowHTTP: true,
		HS256Secret: secret, HS256Issuer: hs256Issuer,
		// Each test rotates or takes keys away within moments.
		MinRefetch: 10 * time.Millisecond,
	}
	if configure != nil {
		configure(&cfg)
	}
	l := startLiveAPI(t, func(c *api.Config) { c.JWT = cfg }, "alice")
	return &jwtBundle{bundle: l.bundle, provider: provider, secret: secret, api: l.api}
}

// hs256 is a token of the backend for sub, valid for a minute.
func (b *jwtBundle) hs256(t *testing.T, sub string) string {
	return oidctest.HS256(t, b.secret, oidctest.Claims(hs256Issuer, sub, jwtAudience, time.Minute))
}

// userNames are the names of every user, in order of creation.
func userNames(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT name FROM users ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	return names
}

// TestProviderTokensWorkOnEveryRouteBesideBatonTokensAndARotatedKeyIsPickedUp:
// access tokens from oidc-provider's own token endpoint (client
// credentials, resource indicator) reach every /v1 route, the event stream
// by header and by ?access_token=, as the user "<iss>|<sub>", made on the
// first request; a Baton token works beside them. The provider restarts
// with a new signing key: its new tokens work without a restart of the
// API, and the withdrawn key's do not.
func TestProviderTokensWorkOnEveryRouteBesideBatonTokensAndARotatedKeyIsPickedUp(t *testing.T) {
	t.Parallel()
	b := jwtSetup(t, oidctest.StartProvider(t), nil)
	token := b.provider.Token(t, jwtAudience)

	b.createConversation(t, token, "demo")
	require.Equal(t, []string{"alice", b.provider.Issuer + "|" + oidctest.ClientID}, userNames(t, b.bundle),
		"the provider's user is made on its first request, named <iss>|<sub>")
	byHeader := openSSE(t, b.bundle.srv.URL+convPath("demo", "/events"), token, "")
	require.Equal(t, "ready", byHeader.next(t).Event)
	defer byHeader.close()
	byQuery := openSSE(t, b.bundle.srv.URL+convPath("demo", "/events")+"?access_token="+url.QueryEscape(token), "", "")
	require.Equal(t, "ready", byQuery.next(t).Event)
	defer byQuery.close()

	r := b.do(t, token, "POST", convPath("demo", "/messages"), map[string]any{"id": "m1", "content": "hello"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	for _, s := range []*sseStream{byHeader, byQuery} {
		_, ev := nextEvent(t, s)
		require.Equal(t, batonnats.EventMessage, ev.Type, "each stream sees the JWT user's message")
	}
	for _, call := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/conversations", http.StatusOK},
		{"GET", convPath("demo"), http.StatusOK},
		{"GET", convPath("demo", "/messages"), http.StatusOK},
		{"POST", convPath("demo", "/read"), http.StatusNoContent},
		{"POST", convPath("demo", "/retry"), http.StatusOK},
	} {
		r := b.do(t, token, call.method, call.path, nil)
		require.Equal(t, call.want, r.Status, "%s %s with the provider's token: %s", call.method, call.path, r.Raw)
	}
	r = b.do(t, b.alice, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, r.Status, "a Baton token works beside JWTs: %s", r.Raw)
	require.Empty(t, r.Body["conversations"], "alice sees none of the JWT user's conversations")

	b.provider.Restart()
	rotated := b.provider.Token(t, jwtAudience)
	require.NotEqual(t, token, rotated)
	r = b.do(t, rotated, "GET", convPath("demo", "/messages"), nil)
	require.Equal(t, http.StatusOK, r.Status, "a token of the rotated key, without restarting the API: %s", r.Raw)
	r = b.do(t, token, "GET", convPath("demo", "/messages"), nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "a token of the withdrawn key: %s", r.Raw)
	r = b.do(t, rotated, "DELETE", convPath("demo"), nil)
	require.Equal(t, http.StatusNoContent, r.Status, r.Raw)
	require.Len(t, userNames(t, b.bundle), 2, "the same user after the rotation")
}

// v1Routes are every /v1 route, the event stream by header and by query.
var v1Routes = []struct{ method, path string }{
	{"POST", "/v1/conversations"},
	{"GET", "/v1/conversations"},
	{"GET", "/v1/conversations/demo"},
	{"PATCH", "/v1/conversations/demo"},
	{"DELETE", "/v1/conversations/demo"},
	{"POST", "/v1/conversations/demo/messages"},
	{"GET", "/v1/conversations/demo/messages"},
	{"POST", "/v1/conversations/demo/read"},
	{"POST", "/v1/conversations/demo/retry"},
	{"GET", "/v1/conversations/demo/events"},
	{"GET", "/v1/conversations/demo/events?access_token="},
}

// tableCounts are the rows of every table a request could write.
func tableCounts(t *testing.T, b *bundle) [5]int {
	t.Helper()
	var c [5]int
	err := b.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM users), (SELECT count(*) FROM conversations), (SELECT count(*) FROM messages),
		(SELECT count(*) FROM agent_outbox), (SELECT coalesce(sum(unread_count + retries_in_window), 0) FROM conversations)`).
		Scan(&c[0], &c[1], &c[2], &c[3], &c[4])
	require.NoError(t, err)
	return c
}

// requireRefusedEverywhere sends token to every /v1 route and requires
// 401 with why in the message, and no row changed.
func (b *jwtBundle) requireRefusedEverywhere(t *testing.T, what, token, why string) {
	t.Helper()
	before := tableCounts(t, b.bundle)
	for _, route := range v1Routes {
		var r response
		if strings.HasSuffix(route.path, "access_token=") {
			r = b.do(t, "", route.method, route.path+url.QueryEscape(token), nil)
		} else {
			var body any
			if route.method == "POST" {
				body = map[string]any{"id": "demo2", "content": "x"}
			}
			r = b.do(t, token, route.method, route.path, body)
		}
		require.Equal(t, http.StatusUnauthorized, r.Status, "%s on %s %s: %s", what, route.method, route.path, r.Raw)
		msg, _ := r.Body["error"].(map[string]any)["message"].(string)
		require.Contains(t, msg, why, "%s on %s %s: the reason", what, route.method, route.path)
	}
	require.Equal(t, before, tableCounts(t, b.bundle), "%s changed rows (users, conversations, messages, outbox, counters)", what)
}

// TestEveryRouteRefusesEachBadJWTAndWritesNothing: the provider's keys are
// reached through a JWKS URL in front of it that the test can take down or
// swell (--jwt-jwks-url). Each bad token gets 401 on every /v1 route, the
// event stream's ?access_token= included, for its own reason, and changes
// no row.
func TestEveryRouteRefusesEachBadJWTAndWritesNothing(t *testing.T) {
	t.Parallel()
	provider := oidctest.StartProvider(t)
	front := oidctest.NewKeyServer(t)
	front.Mirror(provider.Issuer + "/jwks")
	b := jwtSetup(t, provider, func(c *jwtauth.Config) { c.JWKSURL = front.JWKSURL })

	good := provider.Token(t, jwtAudience)
	b.createConversation(t, good, "demo")
	claims := oidctest.Payload(t, good)
	changed := oidctest.Payload(t, good)
	changed["sub"] = "someone-else"
	pubDER, err := x509.MarshalPKIXPublicKey(provider.PublicKeys(t).Keys[0].Key)
	require.NoError(t, err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	pubJWK, err := json.Marshal(provider.PublicKeys(t).Keys[0])
	require.NoError(t, err)
	hsClaims := func(change func(map[string]any)) map[string]any {
		c := oidctest.Claims(hs256Issuer, oidctest.ClientID, jwtAudience, time.Minute)
		change(c)
		return c
	}
	// A key of the front's own, published beside the provider's: the
	// control that the front serves keys Baton takes.
	extra := front.NewPublishedKey(t, jose.RS256)
	r := b.do(t, extra.Sign(t, oidctest.Claims(provider.Issuer, "extra", jwtAudience, time.Minute)), "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, r.Status, "a key the front publishes is taken: %s", r.Raw)

	for _, tc := range []struct{ name, token, why string }{
		{"alg none", oidctest.None(t, claims), "algorithm this server accepts"},
		{"HS256 signed with the provider's RSA public key (PEM)", oidctest.HMAC(t, pubPEM, claims), "signature does not verify"},
		{"HS256 signed with the provider's RSA public key (JWK)", oidctest.HMAC(t, pubJWK, claims), "signature does not verify"},
		{"a wrong issuer", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["iss"] = "https://evil.example/" })), "iss must be"},
		{"HS256 claiming the provider's issuer", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["iss"] = provider.Issuer })), "iss must be"},
		{"a wrong audience (the provider's token for another API)", provider.Token(t, "https://other.api.test"), "aud must include"},
		{"expired", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() })), "expired"},
		{"not yet valid", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })), "not valid yet"},
		{"a changed payload", oidctest.WithPayload(t, good, changed), "signature does not verify"},
		{"oversized", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["pad"] = strings.Repeat("x", jwtauth.DefaultMaxTokenBytes) })), "over the limit"},
		{"a user name past the bound", oidctest.HS256(t, b.secret, hsClaims(func(c map[string]any) { c["sub"] = strings.Repeat("u", schema.MaxUserNameLength) })), "over the limit of 512"},
	} {
		b.requireRefusedEverywhere(t, tc.name, tc.token, tc.why)
	}

	front.SetMode(oidctest.Down)
	unknown := front.NewPublishedKey(t, jose.RS256)
	b.requireRefusedEverywhere(t, "an unknown kid with the JWKS down", unknown.Sign(t, oidctest.Claims(provider.Issuer, "x", jwtAudience, time.Minute)), "have no kid")
	r = b.do(t, good, "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, r.Status, "the keys fetched before keep working with the JWKS down: %s", r.Raw)

	front.SetOversized(jwtauth.DefaultMaxResponseBytes)
	b.requireRefusedEverywhere(t, "a key in a JWKS answer over the size limit", unknown.Sign(t, oidctest.Claims(provider.Issuer, "x", jwtAudience, time.Minute)), "have no kid")

	front.SetMode(oidctest.Serving)
	// The keys may be fetched again MinRefetch (10ms) after the last try:
	// a rule of time, which only time passing meets.
	time.Sleep(20 * time.Millisecond)
	r = b.do(t, unknown.Sign(t, oidctest.Claims(provider.Issuer, "x", jwtAudience, time.Minute)), "GET", "/v1/conversations", nil)
	require.Equal(t, http.StatusOK, r.Status, "the same key is taken once the JWKS answers within its limit again: %s", r.Raw)
}

// TestTheSameSubjectFromTwoIssuersIsTwoUsersWhoNeverMeet: the provider's
// token and a backend's HS256 token carry the same sub; each is a user of
// its own, and so is a Baton token's user of that name. Each uses
// conversation "demo" and message "m1" and sees only their own.
func TestTheSameSubjectFromTwoIssuersIsTwoUsersWhoNeverMeet(t *testing.T) {
	t.Parallel()
	b := jwtSetup(t, oidctest.StartProvider(t), nil)
	plain, _, err := schema.CreateToken(context.Background(), b.pool, oidctest.ClientID)
	require.NoError(t, err)
	tokens := map[string]string{
		"provider": b.provider.Token(t, jwtAudience),
		"backend":  b.hs256(t, oidctest.ClientID),
		"baton":    plain,
	}
	for who, token := range tokens {
		b.createConversation(t, token, "demo")
		r := b.do(t, token, "POST", convPath("demo", "/messages"), map[string]any{"id": "m1", "content": "from " + who})
		require.Equal(t, http.StatusAccepted, r.Status, "%s: %s", who, r.Raw)
	}
	require.ElementsMatch(t, []string{"alice", oidctest.ClientID, b.provider.Issuer + "|" + oidctest.ClientID, hs256Issuer + "|" + oidctest.ClientID},
		userNames(t, b.bundle), "three users named apart by issuer")
	for who, token := range tokens {
		r := b.do(t, token, "GET", "/v1/conversations", nil)
		require.Len(t, r.Body["conversations"], 1, "%s sees one conversation", who)
		r = b.do(t, token, "GET", convPath("demo", "/messages"), nil)
		msgs, _ := r.Body["messages"].([]any)
		require.Len(t, msgs, 1, "%s: %s", who, r.Raw)
		require.Equal(t, "from "+who, msgs[0].(map[string]any)["content"], "%s reads only their own message", who)
	}
	r := b.do(t, tokens["backend"], "DELETE", convPath("demo"), nil)
	require.Equal(t, http.StatusNoContent, r.Status)
	r = b.do(t, tokens["provider"], "GET", convPath("demo"), nil)
	require.Equal(t, http.StatusOK, r.Status, "the backend's user deleted their own demo, not the provider's user's")
}

// TestAJWTUserHasEveryQuotaOfAUser: a backend's HS256 user past the
// conversations quota and the message burst gets 429 like any user, and
// another JWT user of the same backend is not held back by it.
func TestAJWTUserHasEveryQuotaOfAUser(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	secret := []byte(strings.Repeat("q", 32))
	srv, err := api.New(api.Config{MessageBurst: 1, MessagesPerMinute: 1, Quotas: api.Quotas{MaxConversations: 1},
		JWT: jwtauth.Config{HS256Secret: secret, HS256Issuer: hs256Issuer, Audience: jwtAudience}}, db.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b := &bundle{pool: db.Pool, srv: hs, client: hs.Client()}
	token := func(sub string) string {
		return oidctest.HS256(t, secret, oidctest.Claims(hs256Issuer, sub, jwtAudience, time.Minute))
	}
	ada, bob := token("ada"), token("bob")
	b.createConversation(t, ada, "one")
	r := b.do(t, ada, "POST", "/v1/conversations", map[string]any{"id": "two"})
	require.Equal(t, http.StatusTooManyRequests, r.Status, "past --max-conversations: %s", r.Raw)
	r = b.do(t, ada, "POST", convPath("one", "/messages"), map[string]any{"id": "m1", "content": "a"})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	r = b.do(t, ada, "POST", convPath("one", "/messages"), map[string]any{"id": "m2", "content": "b"})
	require.Equal(t, http.StatusTooManyRequests, r.Status, "past --message-burst: %s", r.Raw)
	b.createConversation(t, bob, "one")
	r = b.do(t, bob, "POST", convPath("one", "/messages"), map[string]any{"id": "m1", "content": "a"})
	require.Equal(t, http.StatusAccepted, r.Status, "another JWT user posts as before: %s", r.Raw)
}

// TestAJWTEventStreamOutlivesItsRechecksAndEndsAtItsExpiry: a JWT has no
// token row; an event stream opened with one is not taken for revoked at
// its rechecks (every 100ms here), and ends with token_expired at the
// token's exp.
func TestAJWTEventStreamOutlivesItsRechecksAndEndsAtItsExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	secret := []byte(strings.Repeat("e", 32))
	srv, err := api.New(api.Config{StreamRecheck: 100 * time.Millisecond,
		JWT: jwtauth.Config{HS256Secret: secret, HS256Issuer: hs256Issuer, Audience: jwtAudience}}, db.Pool, js)
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)
	b := &bundle{pool: db.Pool, srv: hs, client: hs.Client()}
	lifetime := 3 * time.Second
	token := oidctest.HS256(t, secret, oidctest.Claims(hs256Issuer, "ada", jwtAudience, lifetime))
	b.createConversation(t, token, "demo")
	s := openSSE(t, hs.URL+convPath("demo", "/events"), token, "")
	defer s.close()
	require.Equal(t, "ready", s.next(t).Event)
	end := s.next(t)
	require.Equal(t, "end", end.Event)
	require.JSONEq(t, `{"reason":"token_expired"}`, end.Data, "the stream ends at the JWT's exp, not at a recheck")
}
