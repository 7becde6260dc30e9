package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestAnOperatorSignsInWithAnOperatorTokenAndTheSessionEndsWhenItIsRevoked:
// no session is the sign-in page; an admin's token signs in and the
// overview shows; signing out ends the session, and so does revoking the
// token of another session. Both sign-ins and the sign-out are recorded.
func TestAnOperatorSignsInWithAnOperatorTokenAndTheSessionEndsWhenItIsRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true})
	ctx := context.Background()

	anon := b.browser()
	p := anon.get("/")
	require.Equal(t, http.StatusSeeOther, p.status, "no session: the sign-in page")
	require.Equal(t, "/signin", p.location)
	p = anon.get("/signin")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, `type="password"`)

	token := b.operatorToken("ops-ada", schema.RoleAdmin)
	br := b.signedIn(token)
	p = br.get("/")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, "ops-ada")
	require.Contains(t, p.body, "turns running")
	cookie := p.header.Get("Set-Cookie")
	require.Empty(t, cookie, "the session cookie is set once, at sign-in")

	csrf := br.csrf("/")
	p = br.post("/signout", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.status)
	require.Equal(t, "/signin", br.get("/").location, "signed out: the sign-in page again")

	// A second session of the same token ends when the token is revoked.
	second := b.signedIn(token)
	require.Equal(t, http.StatusOK, second.get("/").status)
	tokens, err := schema.ListTokens(ctx, b.db.Pool, "ops-ada")
	require.NoError(t, err)
	_, err = schema.RevokeToken(ctx, b.db.Pool, tokens[0].ID)
	require.NoError(t, err)
	require.Equal(t, "/signin", second.get("/").location, "a revoked token's session ends at once")
	p = b.browser().signIn(token)
	require.Equal(t, http.StatusUnauthorized, p.status, "a revoked token signs nobody in")

	require.Equal(t, []string{"ops-ada sign_in ", "ops-ada sign_out ", "ops-ada sign_in "}, b.actions())
}

// TestSignInRefusesAUserTokenAnOperatorTokenAtTheAPIAndFormsFromElsewhere:
// a user's token gets 403 at the console; an operator's token is refused
// by the API's authentication; a sign-in form without its nonce is
// refused.
func TestSignInRefusesAUserTokenAnOperatorTokenAtTheAPIAndFormsFromElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true})
	ctx := context.Background()
	userToken, _, err := schema.CreateToken(ctx, b.db.Pool, "bob")
	require.NoError(t, err)

	p := b.browser().signIn(userToken)
	require.Equal(t, http.StatusForbidden, p.status)
	require.Contains(t, p.body, "user&#39;s token")

	op := b.operatorToken("ops-bea", schema.RoleViewer)
	_, err = schema.Authenticate(ctx, b.db.Pool, op)
	require.ErrorIs(t, err, schema.ErrOperatorToken, "the API refuses an operator's token")

	br := b.browser()
	br.get("/signin")
	p = br.post("/signin", url.Values{"csrf": {"forged"}, "token": {op}})
	require.Equal(t, http.StatusForbidden, p.status, "a sign-in form without the nonce of its cookie")
	require.Empty(t, b.actions(), "nothing signed in")
}

// TestAViewerReadsButCannotActAndNoActionPassesWithoutItsCSRFToken: a
// viewer sees the pages without action buttons and gets 403 on an action
// even with the right token; an admin's action without the CSRF token,
// or with another session's, is refused; nothing is changed or recorded.
func TestAViewerReadsButCannotActAndNoActionPassesWithoutItsCSRFToken(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.failing.Store(true)
	key := b.send("c1", "m1", "hello")
	b.waitStatus(key, "error")

	viewer := b.signedIn(b.operatorToken("ops-vic", schema.RoleViewer))
	p := viewer.get("/conversations/" + key)
	require.Equal(t, http.StatusOK, p.status)
	require.NotContains(t, p.body, `id="retry"`, "no Retry for a viewer")
	csrf := viewer.csrf("/turns")
	p = viewer.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusForbidden, p.status, "a viewer cannot act")

	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	p = admin.get("/conversations/" + key)
	require.Contains(t, p.body, `id="retry"`)
	p = admin.post("/conversations/"+key+"/retry", url.Values{})
	require.Equal(t, http.StatusForbidden, p.status, "no CSRF token: refused")
	require.Contains(t, p.body, "CSRF")
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusForbidden, p.status, "another session's CSRF token: refused")
	b.waitStatus(key, "error")

	var acts []string
	for _, a := range b.actions() {
		if !strings.Contains(a, "sign_in") {
			acts = append(acts, a)
		}
	}
	require.Equal(t, []string{"ops-vic view_conversation " + key, "ops-ada view_conversation " + key}, acts, "views are recorded; refused actions are not actions")
}

// TestAnAdminRetriesAFailedTurnTheUsersWay: the failed turn is on the
// overview and the failed-turns page; Retry puts it back as the user's
// Retry does, the worker answers it, and the retry is recorded.
func TestAnAdminRetriesAFailedTurnTheUsersWay(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.failing.Store(true)
	key := b.send("c1", "m1", "hello")
	b.waitStatus(key, "error")

	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return regexp.MustCompile(`id="failed-last-hour">1<`).MatchString(admin.get("/overview/live").body)
	}, "the overview counts the failed turn")
	p := admin.get("/turns")
	require.Contains(t, p.body, "c1")
	require.Contains(t, p.body, "the model is down")

	b.failing.Store(false)
	csrf := admin.csrf("/turns")
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}, "back": {"turns"}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Equal(t, "/turns?notice=retried", p.location)
	b.waitStatus(key, "done")
	p = admin.get("/conversations/" + key)
	require.Contains(t, p.body, "echo: hello")
	require.NotContains(t, admin.get("/turns").body, `class="failed-turn-row"`, "no failed turn is left")
	require.Contains(t, b.actions(), "ops-ada retry_turn "+key)
	var epoch int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT epoch FROM agent_outbox WHERE conversation_id = $1`, key).Scan(&epoch))
	require.Equal(t, 1, epoch, "the user's retry: a new retry epoch")
}

// pay is a write tool whose first call is sent and never answered: its
// outcome is unknown.
type pay struct{ calls *atomic.Int32 }

func (pay) Name() string            { return "pay" }
func (pay) Version() string         { return "1" }
func (pay) Effect() consumer.Effect { return consumer.EffectWrite }
func (p pay) Call(context.Context, consumer.Invocation) (string, error) {
	if p.calls.Add(1) == 1 {
		return "", &consumer.OutcomeUnknownError{Tool: "pay", Err: errors.New("the connection dropped after the request was sent")}
	}
	return "paid again", nil
}

// TestAnOperatorRecordsWhatBecameOfAnUnknownWriteAndTheTurnGoesOnFromItsJournal:
// a turn whose write's outcome is unknown fails visibly; Retry is refused
// until the operator records it; "it was done" with its result, then
// Retry, and the turn goes on from its journal with that result as the
// call's answer: the call is not sent again, the retry epoch is the same.
func TestAnOperatorRecordsWhatBecameOfAnUnknownWriteAndTheTurnGoesOnFromItsJournal(t *testing.T) {
	t.Parallel()
	calls := &atomic.Int32{}
	b := setup(t, options{tools: consumer.Tools{}.Register(pay{calls: calls})})
	key := b.send("c1", "m1", "/tool pay 10 EUR to bob\nthanks")
	b.waitStatus(key, "error")
	require.Equal(t, int32(1), calls.Load())

	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	p := admin.get("/conversations/" + key)
	require.Contains(t, p.body, "outcome is unknown")
	require.NotContains(t, p.body, `id="retry"`, "no Retry before the outcome is recorded")
	csrf := csrfField.FindStringSubmatch(p.body)[1]
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusConflict, p.status, "Retry is refused while the outcome is unknown")

	opID := regexp.MustCompile(`/operations/(\d+)/outcome`).FindStringSubmatch(p.body + admin.get("/conversations/"+key).body)
	require.NotNil(t, opID)
	p = admin.post("/conversations/"+key+"/operations/"+opID[1]+"/outcome", url.Values{"csrf": {csrf}, "outcome": {"done"}, "result": {"payment 4711 sent"}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	p = admin.post("/conversations/"+key+"/operations/"+opID[1]+"/outcome", url.Values{"csrf": {csrf}, "outcome": {"not_done"}})
	require.Equal(t, http.StatusConflict, p.status, "an outcome is recorded once")

	p = admin.get("/conversations/" + key)
	require.Contains(t, p.body, "Retry from the journal")
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	require.Contains(t, p.location, "notice=resumed")
	b.waitStatus(key, "done")
	require.Equal(t, int32(1), calls.Load(), "the call was not sent again")
	p = admin.get("/conversations/" + key)
	require.Contains(t, p.body, "[pay: payment 4711 sent]", "the agent read the recorded result")
	var epoch int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT epoch FROM agent_outbox WHERE conversation_id = $1`, key).Scan(&epoch))
	require.Zero(t, epoch, "the turn went on in its epoch")
	acts := b.actions()
	require.Contains(t, acts, "ops-ada record_outcome "+key)
	require.Contains(t, acts, "ops-ada resume_turn "+key)
}

// TestAnUnknownWriteRecordedAsNotDoneIsAFailedCallTheAgentReads: "it was
// not done", and the turn goes on with the call failed.
func TestAnUnknownWriteRecordedAsNotDoneIsAFailedCallTheAgentReads(t *testing.T) {
	t.Parallel()
	calls := &atomic.Int32{}
	b := setup(t, options{tools: consumer.Tools{}.Register(pay{calls: calls})})
	key := b.send("c1", "m1", "/tool pay 10 EUR to bob")
	b.waitStatus(key, "error")
	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	page := admin.get("/conversations/" + key).body
	csrf := csrfField.FindStringSubmatch(page)[1]
	opID := regexp.MustCompile(`/operations/(\d+)/outcome`).FindStringSubmatch(page)[1]
	p := admin.post("/conversations/"+key+"/operations/"+opID+"/outcome", url.Values{"csrf": {csrf}, "outcome": {"not_done"}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	b.waitStatus(key, "done")
	require.Equal(t, int32(1), calls.Load())
	require.Contains(t, admin.get("/conversations/"+key).body, "it was not done")
}

// TestSignInAttemptsAreLimitedPerAddress: past the burst, 429 with
// Retry-After, whatever the token.
func TestSignInAttemptsAreLimitedPerAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true, cfg: console.Config{SignInPerMinute: 1, SignInBurst: 3}})
	br := b.browser()
	for i := range 3 {
		p := br.signIn("baton_wrong_" + strings.Repeat("x", i+1))
		require.Equal(t, http.StatusUnauthorized, p.status)
	}
	p := br.signIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	require.Equal(t, http.StatusTooManyRequests, p.status, "the fourth attempt in a minute")
	require.NotEmpty(t, p.header.Get("Retry-After"))
}

// TestEveryPageCarriesTheSecurityHeadersAndNoSecret: a strict CSP without
// inline script on every answer; the cookie HttpOnly and SameSite=Strict;
// no page shows the database URL, the token or the session's secret.
func TestEveryPageCarriesTheSecurityHeadersAndNoSecret(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	key := b.send("c1", "m1", "hello")
	b.waitStatus(key, "done")
	token := b.operatorToken("ops-ada", schema.RoleAdmin)
	br := b.browser()
	p := br.signIn(token)
	cookie := p.header.Get("Set-Cookie")
	require.Contains(t, cookie, "HttpOnly")
	require.Contains(t, cookie, "SameSite=Strict")
	secret := strings.TrimPrefix(strings.SplitN(cookie, ";", 2)[0], "baton_console=")
	require.NotEmpty(t, secret)
	for _, path := range []string{"/signin", "/", "/overview/live", "/conversations?user=alice", "/conversations/" + key, "/turns", "/dead-letters", "/actions", "/nope"} {
		p := br.get(path)
		csp := p.header.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"), path)
		for _, s := range []string{b.db.URL, token, secret} {
			require.NotContains(t, p.body, s, "%s shows a secret", path)
		}
		require.NotRegexp(t, `<script>|<script [^>]*>[^<]|\son[a-z]+=`, p.body, "%s runs inline script", path)
	}
}

// charge is a write tool that succeeds, after which the model goes down.
type charge struct {
	calls   *atomic.Int32
	failing *atomic.Bool
}

func (charge) Name() string            { return "charge" }
func (charge) Version() string         { return "1" }
func (charge) Effect() consumer.Effect { return consumer.EffectWrite }
func (c charge) Call(context.Context, consumer.Invocation) (string, error) {
	c.calls.Add(1)
	c.failing.Store(true)
	return "charged", nil
}

// TestAnOperatorsRetryOfATurnThatMadeWritesRepeatsThemOnlyWhenTicked: a
// turn that made a write and then failed is not started over by Retry
// alone (409, naming the tool); with "and repeat its writes" it is, as
// the user's retry with repeat_writes.
func TestAnOperatorsRetryOfATurnThatMadeWritesRepeatsThemOnlyWhenTicked(t *testing.T) {
	t.Parallel()
	calls, failing := &atomic.Int32{}, &atomic.Bool{}
	b := setup(t, options{failing: failing, tools: consumer.Tools{}.Register(charge{calls: calls, failing: failing})})
	key := b.send("c1", "m1", "/tool charge 10 EUR\nthanks")
	b.waitStatus(key, "error")
	require.Equal(t, int32(1), calls.Load())

	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	page := admin.get("/conversations/" + key).body
	require.Contains(t, page, `name="repeat_writes"`)
	csrf := csrfField.FindStringSubmatch(page)[1]
	p := admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusConflict, p.status, p.body)
	require.Contains(t, p.body, "charge")
	b.waitStatus(key, "error")
	require.NotContains(t, b.actions(), "ops-ada retry_turn "+key, "a refused retry is no action")

	b.failing.Store(false)
	p = admin.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}, "repeat_writes": {"1"}})
	require.Equal(t, http.StatusSeeOther, p.status, p.body)
	testenv.Eventually(t, 20*time.Second, func() bool { return calls.Load() == 2 }, "the write is made again, as the operator asked")
	require.Contains(t, b.actions(), "ops-ada retry_turn "+key)
}
