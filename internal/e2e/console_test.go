package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// consoleScreenshots names a folder (relative to the repository's root,
// or absolute) where the console's test writes the screenshots that
// docs/guides/console.md shows, besides its artifacts:
//
//	BATON_CONSOLE_SCREENSHOTS=docs/guides/console go test -run Console ./internal/e2e/
const consoleScreenshots = "BATON_CONSOLE_SCREENSHOTS"

// consoleStack is the operator console in headless Chromium over a real
// stack: PostgreSQL, NATS, the relay and a worker whose model the test can
// take down, with a write tool whose first call loses its answer.
type consoleStack struct {
	t        *testing.T
	db       *testenv.DB
	web      *httptest.Server
	ctx      context.Context
	user     schema.User
	down     *atomic.Bool
	payCalls *atomic.Int32
	artifact string
}

// downModel is the echo agent while the model is up.
type downModel struct {
	consumer.Echo
	down *atomic.Bool
}

func (m downModel) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	if m.down.Load() {
		return consumer.Step{}, errors.New("model server: 503 Service Unavailable")
	}
	return m.Echo.Step(ctx, req)
}

// payTool sends a payment; its first call's answer is lost.
type payTool struct{ calls *atomic.Int32 }

func (payTool) Name() string            { return "pay" }
func (payTool) Version() string         { return "1" }
func (payTool) Effect() consumer.Effect { return consumer.EffectWrite }
func (p payTool) Call(context.Context, consumer.Invocation) (string, error) {
	if p.calls.Add(1) == 1 {
		return "", &consumer.OutcomeUnknownError{Tool: "pay", Err: errors.New("the connection to the payment service dropped after the request was sent")}
	}
	return "paid", nil
}

func startConsole(t *testing.T) *consoleStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	nc, err := natsclient.Connect(ns.URL, natsclient.MaxReconnects(-1), natsclient.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, _, err = batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	s := &consoleStack{t: t, db: db, down: &atomic.Bool{}, payCalls: &atomic.Int32{}}
	stackDone := make(chan error, 1)
	go func() {
		stackDone <- cli.RunStack(ctx, cli.StackConfig{
			Relay: relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
			Worker: consumer.Config{
				Agent:       downModel{Echo: consumer.Echo{Directives: true}, down: s.down},
				Tools:       consumer.Tools{}.Register(consumer.LookupTool{}, payTool{calls: s.payCalls}),
				MaxAttempts: 2, Lease: 5 * time.Second, RetryDelay: 100 * time.Millisecond, Debounce: 50 * time.Millisecond,
			},
		}, db.Pool, nc)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-stackDone; err != nil {
			t.Errorf("stack: %v", err)
		}
	})
	srv, err := console.New(console.Config{Slot: "slot_" + db.Name, Stream: batonnats.DefaultStream, RefreshInterval: time.Second}, db.Pool, js)
	require.NoError(t, err)
	s.web = httptest.NewServer(srv.Handler())
	t.Cleanup(s.web.Close)
	_, s.user, err = schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	s.artifact = artifactDir(t)

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	s.ctx = bctx
	return s
}

// send stores a user message as the API does and returns the
// conversation's key.
func (s *consoleStack) send(conversation, title, message, content string) string {
	s.t.Helper()
	ctx := context.Background()
	var key string
	require.NoError(s.t, pgx.BeginFunc(ctx, s.db.Pool, func(tx pgx.Tx) error {
		if _, _, err := schema.CreateConversation(ctx, tx, s.user.ID, conversation, title); err != nil {
			return err
		}
		res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: s.user.ID, ConversationID: conversation, MessageID: message, Content: content})
		key = res.ConversationKey
		return err
	}))
	return key
}

func (s *consoleStack) status(key string) string {
	var st string
	_ = s.db.Pool.QueryRow(context.Background(), `SELECT status FROM agent_outbox WHERE conversation_id = $1 ORDER BY id DESC LIMIT 1`, key).Scan(&st)
	return st
}

func (s *consoleStack) open(path string) {
	s.t.Helper()
	require.NoError(s.t, chromedp.Do(s.ctx, chromedp.Navigate(s.web.URL+path)))
}

func (s *consoleStack) waitJS(what, expr string, timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(s.ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	s.screenshot("timeout")
	html, _ := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	s.t.Fatalf("waited %s for %s (%s); last error: %v; the page says:\n%s", timeout, what, expr, last, html)
}

func (s *consoleStack) js(expr string) bool {
	s.t.Helper()
	ok, err := chromedp.Run(s.ctx, chromedp.Evaluate[bool](expr))
	require.NoError(s.t, err)
	return ok
}

// post sends a form from the page with fetch, as a script of the page
// would, and returns the status.
func (s *consoleStack) post(path string, fields map[string]string) int {
	s.t.Helper()
	var parts []string
	for k, v := range fields {
		parts = append(parts, fmt.Sprintf("[%q, %q]", k, v))
	}
	expr := fmt.Sprintf(`fetch(%q, {method: "POST", redirect: "manual", body: new URLSearchParams([%s])}).then(r => r.status)`, path, strings.Join(parts, ","))
	status, err := chromedp.Run(s.ctx, chromedp.Evaluate[int](expr, chromedp.EvalAwaitPromise))
	require.NoError(s.t, err)
	return status
}

func (s *consoleStack) screenshot(name string) {
	buf, err := chromedp.Run(s.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		s.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(s.artifact, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err == nil {
		s.t.Logf("screenshot: %s", path)
	}
}

// docsScreenshot saves a screenshot as an artifact, and the whole page
// for the docs when BATON_CONSOLE_SCREENSHOTS names a folder.
func (s *consoleStack) docsScreenshot(name string) {
	s.screenshot(name)
	dir := os.Getenv(consoleScreenshots)
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", dir) // the tests run in internal/e2e
	}
	buf, err := chromedp.Run(s.ctx, chromedp.FullScreenshot(100))
	require.NoError(s.t, err)
	require.NoError(s.t, os.MkdirAll(dir, 0o755))
	require.NoError(s.t, os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644))
	s.t.Logf("docs screenshot: %s", filepath.Join(dir, name+".png"))
}

// signIn signs in through the form with token.
func (s *consoleStack) signIn(token string) {
	s.t.Helper()
	s.open("/signin")
	s.waitJS("the sign-in form", `!!document.getElementById("signin")`, 10*time.Second)
	require.NoError(s.t, chromedp.Do(s.ctx,
		chromedp.SetValue("#token", token),
		chromedp.Submit("#signin"),
	))
}

func (s *consoleStack) signOut() {
	s.t.Helper()
	require.NoError(s.t, chromedp.Do(s.ctx, chromedp.Click("#signout")))
	s.waitJS("the sign-in page", `!!document.getElementById("signin")`, 10*time.Second)
}

// TestTheConsoleInChromiumShowsAFailedTurnRetriesItAndDiscardsADeadLetter
// drives the operator console in a real browser: no session is the
// sign-in page; a user's token is refused (403); an admin signs in, sees
// the failed turn on the overview and the failed-turns page, opens its
// conversation, presses Retry and sees the turn answered; records what
// became of a write whose outcome was unknown and retries that turn from
// its journal; discards a dead letter. A viewer sees no action and is
// refused one; an action without the CSRF token is refused.
// operator_actions holds each action and each view.
func TestTheConsoleInChromiumShowsAFailedTurnRetriesItAndDiscardsADeadLetter(t *testing.T) {
	s := startConsole(t)
	ctx := context.Background()
	admin, _, err := schema.CreateOperatorToken(ctx, s.db.Pool, "ops-ada", schema.RoleAdmin, time.Time{})
	require.NoError(t, err)
	viewer, _, err := schema.CreateOperatorToken(ctx, s.db.Pool, "ops-vic", schema.RoleViewer, time.Time{})
	require.NoError(t, err)
	userToken, _, err := schema.CreateToken(ctx, s.db.Pool, "bob")
	require.NoError(t, err)

	// Turns that answered, one that failed while the model was down, and
	// one whose write lost its answer.
	var warm []string
	for i := range 3 {
		warm = append(warm, s.send(fmt.Sprintf("warm-%d", i), "Warm-up", fmt.Sprintf("w%d", i), "good morning"))
	}
	for _, key := range warm {
		testenv.Eventually(t, 20*time.Second, func() bool { return s.status(key) == "done" }, "the warm-up turn is answered")
	}
	s.down.Store(true)
	failed := s.send("trip-to-lyon", "Trip to Lyon", "m1", "/tool lookup weather in Lyon\nWhat should I pack?")
	testenv.Eventually(t, 30*time.Second, func() bool { return s.status(failed) == "error" }, "the turn fails while the model is down")
	s.down.Store(false)
	unknown := s.send("rent", "Rent", "m2", "/tool pay 950 EUR to the landlord\nPlease pay the rent.")
	testenv.Eventually(t, 30*time.Second, func() bool { return s.status(unknown) == "error" }, "the turn whose write lost its answer fails")
	require.Equal(t, int32(1), s.payCalls.Load())
	// A dead letter of the webhook group.
	require.NoError(t, schema.Park(ctx, s.db.Pool, schema.DeadLetter{
		Group: "webhook", EventID: "outbox-42", Stream: batonnats.DefaultStream, StreamSeq: 42, Subject: "baton.outbox.0.x",
		Headers: []byte(`{"Nats-Msg-Id":["outbox-42"]}`), Payload: []byte(`{"outbox_id":42}`), Attempts: 5, Error: "POST https://hooks.example.com/baton: 500 Internal Server Error",
	}))

	// No session: the sign-in page. A user's token: refused.
	s.open("/")
	s.waitJS("the sign-in page", `!!document.getElementById("signin")`, 10*time.Second)
	s.screenshot("signin")
	s.signIn(userToken)
	s.waitJS("the refusal of a user's token", `(document.getElementById("problem") || {textContent: ""}).textContent.includes("user's token")`, 10*time.Second)
	s.screenshot("user-token-refused")
	nonce, err := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.querySelector('#signin input[name="csrf"]').value`))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, s.post("/signin", map[string]string{"csrf": nonce, "token": userToken}), "a user's token gets 403")
	resp, err := http.PostForm(s.web.URL+"/signin", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a form without its nonce")

	// The admin: the overview counts the failed turns.
	s.signIn(admin)
	s.waitJS("the overview", `!!document.getElementById("turn-counts")`, 10*time.Second)
	s.waitJS("the failed turns on the overview, live", `document.getElementById("failed-last-hour").textContent === "2"`, 20*time.Second)
	s.waitJS("the groups on the overview", `document.querySelector("#groups").textContent.includes("turns")`, 10*time.Second)
	s.docsScreenshot("overview")

	// The failed-turns page, then the conversation, and Retry.
	s.open("/turns")
	s.waitJS("the failed turns", `document.querySelectorAll(".failed-turn-row").length === 2`, 10*time.Second)
	require.True(t, s.js(`document.getElementById("failed-turns").textContent.includes("503 Service Unavailable")`), "the error is shown")
	require.True(t, s.js(`document.getElementById("failed-turns").textContent.includes("outcome unknown: pay")`))
	s.docsScreenshot("failed-turns")
	require.Equal(t, http.StatusForbidden, s.post("/conversations/"+failed+"/retry", map[string]string{}), "an action without the CSRF token is refused")
	require.NoError(t, chromedp.Do(s.ctx, chromedp.Click(`a[href="/conversations/`+failed+`"]`)))
	s.waitJS("the conversation", `!!document.getElementById("conversation-key")`, 10*time.Second)
	s.waitJS("its Retry", `!!document.getElementById("retry")`, 10*time.Second)
	require.NoError(t, chromedp.Do(s.ctx, chromedp.Click("#retry")))
	s.waitJS("the notice", `(document.getElementById("notice") || {textContent: ""}).textContent.includes("put back")`, 10*time.Second)
	s.waitJS("the turn answered, live", `[...document.querySelectorAll("article.message.role-assistant")].some(e => e.textContent.includes("echo: What should I pack?"))`, 30*time.Second)
	s.waitJS("its tool call in the journal", `document.querySelector("#turns table.ops") && document.querySelector("#turns table.ops").textContent.includes("lookup")`, 10*time.Second)
	s.docsScreenshot("conversation")
	require.Equal(t, "done", s.status(failed))

	// The write whose outcome was unknown: recorded as done, then the
	// turn goes on from its journal without sending it again.
	s.open("/conversations/" + unknown)
	s.waitJS("the outcome form", `!!document.querySelector("form.outcome-form")`, 10*time.Second)
	require.False(t, s.js(`!!document.getElementById("retry")`), "no Retry while the outcome is unknown")
	s.screenshot("outcome-unknown")
	require.NoError(t, chromedp.Do(s.ctx,
		chromedp.Click(`form.outcome-form input[value="done"]`),
		chromedp.SetValue(`form.outcome-form textarea[name="result"]`, "payment 2024-0117 sent"),
		chromedp.Click(`form.outcome-form button.record-outcome`),
	))
	s.waitJS("Retry from the journal", `(document.getElementById("retry") || {textContent: ""}).textContent.includes("from the journal")`, 10*time.Second)
	require.NoError(t, chromedp.Do(s.ctx, chromedp.Click("#retry")))
	s.waitJS("the turn answered with the recorded result", `[...document.querySelectorAll("article.message.role-assistant")].some(e => e.textContent.includes("[pay: payment 2024-0117 sent]"))`, 30*time.Second)
	s.screenshot("outcome-recorded")
	require.Equal(t, int32(1), s.payCalls.Load(), "the payment was not sent again")

	// The dead letter: discarded.
	s.open("/dead-letters")
	s.waitJS("the group", `document.getElementById("dead-letter-groups").textContent.includes("webhook")`, 10*time.Second)
	s.open("/dead-letters/webhook")
	s.waitJS("the dead letter", `!!document.querySelector("article.dead-letter")`, 10*time.Second)
	s.screenshot("dead-letters")
	require.NoError(t, chromedp.Do(s.ctx, chromedp.Click("button.discard")))
	s.waitJS("no dead letter left", `!!document.getElementById("no-dead-letters")`, 10*time.Second)

	// The record of what the operator did.
	s.open("/actions")
	s.waitJS("the actions", `document.querySelectorAll("#actions tr.action").length >= 6`, 10*time.Second)
	s.screenshot("actions")
	s.signOut()

	// A viewer: no action to take, and one tried is refused.
	s.signIn(viewer)
	s.waitJS("the overview", `!!document.getElementById("turn-counts")`, 10*time.Second)
	s.open("/conversations/" + failed)
	s.waitJS("the conversation", `!!document.getElementById("conversation-key")`, 10*time.Second)
	s.open("/dead-letters/webhook")
	s.waitJS("the page", `!!document.querySelector("main h1")`, 10*time.Second)
	require.False(t, s.js(`!!document.querySelector("button.discard, button.retry, #retry")`), "a viewer sees no action")
	csrf, err := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.querySelector('input[name="csrf"]').value`))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, s.post("/conversations/"+failed+"/retry", map[string]string{"csrf": csrf}), "a viewer cannot act")

	rows, err := s.db.Pool.Query(ctx, `SELECT operator || ' ' || action || ' ' || target FROM operator_actions ORDER BY id`)
	require.NoError(t, err)
	acts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	dead, err := schema.DeadLetters(ctx, s.db.Pool, "webhook", true)
	require.NoError(t, err)
	require.Equal(t, []string{
		"ops-ada sign_in ",
		"ops-ada view_conversation " + failed,
		"ops-ada retry_turn " + failed,
		"ops-ada view_conversation " + failed,
		"ops-ada view_conversation " + unknown,
		"ops-ada record_outcome " + unknown,
		"ops-ada view_conversation " + unknown,
		"ops-ada resume_turn " + unknown,
		"ops-ada view_conversation " + unknown,
		fmt.Sprintf("ops-ada discard_dead_letter webhook/%d", dead[0].ID),
		"ops-ada sign_out ",
		"ops-vic sign_in ",
		"ops-vic view_conversation " + failed,
	}, acts, "every action and every view of a conversation's content, in order")
}
