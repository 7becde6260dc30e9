package console_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/schema"
)

// TestEveryRouteButSignInHealthAndStaticNeedsASession tries every route
// the console serves: without a session, and with a cookie the console
// never issued, a page goes to the sign-in page and an action is refused;
// a viewer's action is refused with the right CSRF token, and an admin's
// without it. Only the sign-in page, the health checks and the static
// files are public. Nothing tried is recorded or changed.
func TestEveryRouteButSignInHealthAndStaticNeedsASession(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true})
	ctx := context.Background()
	key := b.send("c1", "m1", "hello")
	require.NoError(t, schema.Park(ctx, b.db.Pool, schema.DeadLetter{Group: "webhook", EventID: "outbox-1", Stream: "S", StreamSeq: 1, Subject: "x",
		Payload: []byte(`{}`), Attempts: 5, Error: "500"}))
	viewer := b.signedIn(b.operatorToken("ops-vic", schema.RoleViewer))
	admin := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	viewerCSRF, adminCSRF := viewer.csrf("/"), admin.csrf("/")

	var public []string
	path := strings.NewReplacer("{$}", "", "{key}", key, "{id}", "1", "{group}", "webhook")
	routes := b.srv.Routes()
	require.Greater(t, len(routes), 10)
	for _, rt := range routes {
		method, pattern, _ := strings.Cut(rt.Pattern, " ")
		if rt.Access == "public" {
			public = append(public, rt.Pattern)
			continue
		}
		p := path.Replace(pattern)
		for _, br := range []*browser{b.browser(), b.withCookie("baton_console", "not-a-session-secret")} {
			var got page
			if method == http.MethodGet {
				got = br.get(p)
				require.Equal(t, http.StatusSeeOther, got.status, "GET %s without a session", p)
				require.Equal(t, "/signin", got.location, "GET %s without a session", p)
				req, err := http.NewRequest(method, b.web.URL+p, nil)
				require.NoError(t, err)
				req.Header.Set("HX-Request", "true")
				got = br.do(req)
				require.Equal(t, http.StatusUnauthorized, got.status, "a refresh of part of %s without a session", p)
				require.Equal(t, "/signin", got.header.Get("HX-Redirect"))
			} else {
				got = br.post(p, url.Values{"csrf": {adminCSRF}, "outcome": {"not_done"}})
				require.Equal(t, http.StatusUnauthorized, got.status, "POST %s without a session", p)
			}
		}
		if method != http.MethodPost {
			continue
		}
		got := admin.post(p, url.Values{"outcome": {"not_done"}})
		require.Equal(t, http.StatusForbidden, got.status, "POST %s without the CSRF token", p)
		got = admin.post(p, url.Values{"csrf": {viewerCSRF}, "outcome": {"not_done"}})
		require.Equal(t, http.StatusForbidden, got.status, "POST %s with another session's CSRF token", p)
		req, err := http.NewRequest(method, b.web.URL+p, strings.NewReader(url.Values{"csrf": {adminCSRF}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		got = admin.do(req)
		require.Equal(t, http.StatusForbidden, got.status, "POST %s from another site", p)
		if rt.Access == "admin" {
			got = viewer.post(p, url.Values{"csrf": {viewerCSRF}, "outcome": {"not_done"}})
			require.Equal(t, http.StatusForbidden, got.status, "POST %s as a viewer", p)
		}
	}
	require.ElementsMatch(t, []string{"GET /static/", "GET /healthz", "GET /readyz", "GET /signin", "POST /signin"}, public,
		"the routes anyone may reach: any other needs a session")

	require.Equal(t, http.StatusOK, viewer.get("/").status, "the refused requests ended no session")
	require.Equal(t, http.StatusOK, admin.get("/").status)
	require.Equal(t, []string{"ops-vic sign_in ", "ops-ada sign_in "}, b.actions(), "nothing refused is recorded")
	open, err := schema.DeadLetters(ctx, b.db.Pool, "webhook", false)
	require.NoError(t, err)
	require.Len(t, open, 1, "the dead letter is untouched")
	require.Nil(t, open[0].RetryRequestedAt)
}

// TestASessionEndsWhenIdleAndAtItsMaxAge: the cookie lasts no longer than
// the session's maximum age; a session unused for longer than the idle
// timeout ends, and so does one past its maximum age however busy.
func TestASessionEndsWhenIdleAndAtItsMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true, cfg: console.Config{SessionIdle: time.Minute, SessionMaxAge: time.Hour}})
	ctx := context.Background()
	token := b.operatorToken("ops-ada", schema.RoleAdmin)

	br := b.browser()
	signedInAt := time.Now()
	p := br.signIn(token)
	require.Equal(t, http.StatusSeeOther, p.status)
	cookie := (&http.Response{Header: p.header}).Cookies()
	var expires time.Time
	for _, c := range cookie {
		if c.Name == "baton_console" {
			expires = c.Expires
		}
	}
	require.WithinDuration(t, signedInAt.Add(time.Hour), expires, 5*time.Second, "the cookie lasts as long as the session may")
	require.Equal(t, http.StatusOK, br.get("/").status)
	_, err := b.db.Pool.Exec(ctx, `UPDATE console_sessions SET last_seen_at = now() - interval '61 seconds'`)
	require.NoError(t, err)
	require.Equal(t, "/signin", br.get("/").location, "idle for longer than a minute: the session ended")

	busy := b.signedIn(token)
	require.Equal(t, http.StatusOK, busy.get("/").status)
	_, err = b.db.Pool.Exec(ctx, `UPDATE console_sessions SET expires_at = now() - interval '1 second', last_seen_at = now() WHERE ended_at IS NULL`)
	require.NoError(t, err)
	require.Equal(t, "/signin", busy.get("/").location, "past its maximum age, a session in use ends")
}

// TestTheConsolesLimitsHaveDefaultsAndRefuseSettingsThatCannotWork: with
// nothing set, sessions last 30 minutes idle and 12 hours at most,
// sign-ins are 10 a minute after 5, pages list 50 rows; settings that
// would turn a limit off are refused, naming the setting.
func TestTheConsolesLimitsHaveDefaultsAndRefuseSettingsThatCannotWork(t *testing.T) {
	t.Parallel()
	d := console.Config{}.WithDefaults()
	require.Equal(t, 30*time.Minute, d.SessionIdle)
	require.Equal(t, 12*time.Hour, d.SessionMaxAge)
	require.Equal(t, 10, d.SignInPerMinute)
	require.Equal(t, 5, d.SignInBurst)
	require.Equal(t, 50, d.PageSize)
	require.NoError(t, d.Validate())
	for name, c := range map[string]console.Config{
		"SessionIdle":     {SessionIdle: time.Second},
		"SessionMaxAge":   {SessionIdle: time.Hour, SessionMaxAge: time.Minute},
		"SignInPerMinute": {SignInPerMinute: -1},
		"SignInBurst":     {SignInBurst: -1},
		"PageSize":        {PageSize: 100_000},
	} {
		err := c.WithDefaults().Validate()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), name)
	}
}

// TestAPageListsAtMostThePageSizeAndGoesOnByItsCursor: a user with more
// conversations than a page holds gets a page of PageSize and a link to
// the next, which starts after the last row shown; following the links
// lists each conversation once. A cursor that is not one is a 400.
func TestAPageListsAtMostThePageSizeAndGoesOnByItsCursor(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true, cfg: console.Config{PageSize: 4}})
	for i := range 10 {
		b.send(fmt.Sprintf("c%02d", i), fmt.Sprintf("m%02d", i), "hello")
	}
	br := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	row := regexp.MustCompile(`href="/conversations/(c_[^"/]+)"`)
	next := regexp.MustCompile(`href="(/conversations\?user=[^"]+after_at=[^"]+)"`)
	seen := map[string]bool{}
	link := "/conversations?user=alice"
	for pages := 1; ; pages++ {
		require.LessOrEqual(t, pages, 3, "10 conversations in pages of 4")
		p := br.get(link)
		require.Equal(t, http.StatusOK, p.status, p.body)
		keys := map[string]bool{}
		for _, m := range row.FindAllStringSubmatch(p.body, -1) {
			keys[m[1]] = true
		}
		require.LessOrEqual(t, len(keys), 4, "a page lists at most PageSize conversations")
		for k := range keys {
			require.False(t, seen[k], "%s is on two pages", k)
			seen[k] = true
		}
		m := next.FindStringSubmatch(p.body)
		if m == nil {
			break
		}
		link = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	require.Len(t, seen, 10, "every conversation is on one page")
	require.Equal(t, http.StatusBadRequest, br.get("/conversations?user=alice&after_at=yesterday&after=x").status)
	require.Equal(t, http.StatusBadRequest, br.get("/turns?after_at=2024-01-01T00:00:00Z&after=DROP").status)
	require.Equal(t, http.StatusBadRequest, br.get("/actions?before=x").status)
}

// TestNoSecretReachesTheLog: sign-ins with a wrong token, a user's token
// and an admin's, an action, and a sign-out log what happened, and never a
// token, the session's secret or its CSRF token.
func TestNoSecretReachesTheLog(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	b := setup(t, options{log: &log})
	ctx := context.Background()
	userToken, _, err := schema.CreateToken(ctx, b.db.Pool, "bob")
	require.NoError(t, err)
	adminToken := b.operatorToken("ops-ada", schema.RoleAdmin)
	b.failing.Store(true)
	key := b.send("c1", "m1", "hello")
	b.waitStatus(key, "error")
	b.failing.Store(false)

	wrong := "baton_" + strings.Repeat("w", 40)
	require.Equal(t, http.StatusUnauthorized, b.browser().signIn(wrong).status)
	require.Equal(t, http.StatusForbidden, b.browser().signIn(userToken).status)
	br := b.browser()
	p := br.signIn(adminToken)
	require.Equal(t, http.StatusSeeOther, p.status)
	secret := strings.TrimPrefix(strings.SplitN(p.header.Get("Set-Cookie"), ";", 2)[0], "baton_console=")
	csrf := br.csrf("/conversations/" + key)
	require.Equal(t, http.StatusSeeOther, br.post("/conversations/"+key+"/retry", url.Values{"csrf": {csrf}}).status)
	b.waitStatus(key, "done")
	require.Equal(t, http.StatusSeeOther, br.post("/signout", url.Values{"csrf": {csrf}}).status)

	out := log.String()
	require.Contains(t, out, "operator signed in", "the log says what happened")
	require.Contains(t, out, "operator retried a failed turn")
	for name, s := range map[string]string{"the admin's token": adminToken, "the user's token": userToken, "a wrong token": wrong,
		"the session's secret": secret, "the CSRF token": csrf} {
		require.NotEmpty(t, s)
		require.NotContains(t, out, s, "the log holds %s", name)
	}
}

// syncBuffer is a bytes.Buffer that the console's goroutines may write to
// at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHideContentShowsMetadataOnly: with HideContent, no page shows a
// message's text, a conversation's title or a dead letter's payload; the
// conversation and the dead letter are still there, by their ids.
func TestHideContentShowsMetadataOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noStack: true, cfg: console.Config{HideContent: true}})
	ctx := context.Background()
	key := b.send("c1", "m1", "my card number is 4111-1111")
	require.NoError(t, schema.Park(ctx, b.db.Pool, schema.DeadLetter{Group: "webhook", EventID: "outbox-1", Stream: "S", StreamSeq: 1, Subject: "x",
		Payload: []byte(`{"secret_payload":true}`), Attempts: 5, Error: "500"}))
	br := b.signedIn(b.operatorToken("ops-ada", schema.RoleAdmin))
	for _, path := range []string{"/", "/conversations?user=alice", "/conversations?id=c1", "/conversations/" + key, "/conversations/" + key + "/live",
		"/turns", "/dead-letters", "/dead-letters/webhook", "/actions"} {
		p := br.get(path)
		require.Equal(t, http.StatusOK, p.status, path)
		for _, content := range []string{"4111-1111", "A title", "secret_payload"} {
			require.NotContains(t, p.body, content, "%s shows content", path)
		}
	}
	require.Contains(t, br.get("/conversations?user=alice").body, key, "the conversation is listed by its ids")
	require.Contains(t, br.get("/dead-letters/webhook").body, "outbox-1", "the dead letter is listed by its event")
}
