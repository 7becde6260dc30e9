package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// page is a real headless Chromium on the web page of a real stack:
// PostgreSQL, NATS JetStream, the relay, a worker with the echo agent and
// the API.
type page struct {
	t        *testing.T
	db       *testenv.DB
	ctx      context.Context
	url      string
	addr     string
	token    string // the token of the first link, user "browser"
	srv      *api.Server
	hs       *http.Server
	artifact string
}

func findChromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found: install Debian's chromium package (make test does: scripts/install-deps.sh chromium)")
	return ""
}

func startPage(t *testing.T, worker ...func(*consumer.Config, *natsclient.Conn)) *page {
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

	wcfg := consumer.Config{
		// The tests send /sleep and /fail lines.
		Agent:       consumer.Echo{Directives: true},
		MaxAttempts: 2, Lease: 5 * time.Second, RetryDelay: 100 * time.Millisecond,
		Debounce: 50 * time.Millisecond,
	}
	for _, f := range worker {
		f(&wcfg, nc)
	}
	stackDone := make(chan error, 1)
	go func() {
		stackDone <- cli.RunStack(ctx, cli.StackConfig{
			Relay:  relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
			Worker: wcfg,
		}, db.Pool, nc)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-stackDone; err != nil {
			t.Errorf("stack: %v", err)
		}
	})

	token, _, err := schema.CreateToken(ctx, db.Pool, "browser")
	require.NoError(t, err)
	srv, err := api.New(api.Config{StreamRecheck: 200 * time.Millisecond}, db.Pool, js)
	require.NoError(t, err)
	p := &page{t: t, db: db, srv: srv, token: token}
	p.artifact = artifactDir(t)
	p.serve("127.0.0.1:0")
	t.Cleanup(p.stopAPI)

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1100, 720),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	p.ctx = bctx
	p.url = fmt.Sprintf("http://%s/#token=%s", p.addr, token)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(p.url)))
	return p
}

func artifactDir(t *testing.T) string {
	dir := os.Getenv("BATON_TEST_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	dir = filepath.Join(dir, t.Name())
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// serve starts the API on addr ("127.0.0.1:0" the first time, the same
// address again after stopAPI).
func (p *page) serve(addr string) {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the old listener's port may linger briefly
	}
	require.NoError(p.t, err)
	p.addr = ln.Addr().String()
	p.hs = p.srv.HTTPServer()
	go func() { _ = p.hs.Serve(ln) }()
}

// stopAPI makes the API unreachable: listener and open connections closed.
func (p *page) stopAPI() {
	if p.hs != nil {
		_ = p.hs.Close()
		p.hs = nil
	}
}

// waitJS polls a JavaScript predicate until it is true or the deadline
// passes.
func (p *page) waitJS(what, expr string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	p.screenshot("timeout")
	p.t.Fatalf("waited %s for %s (%s); last error: %v", timeout, what, expr, last)
}

func (p *page) js(expr string) bool {
	p.t.Helper()
	ok, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](expr))
	require.NoError(p.t, err)
	return ok
}

func (p *page) screenshot(name string) {
	buf, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(p.artifact, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err == nil {
		p.t.Logf("screenshot: %s", path)
	}
}

func (p *page) newConversation(title string) {
	p.t.Helper()
	p.waitJS("the app", `!document.getElementById("app").classList.contains("hidden")`, 10*time.Second)
	require.NoError(p.t, chromedp.Do(p.ctx,
		chromedp.SetValue("#newtitle", title),
		chromedp.Click("#newconv button"),
	))
	p.waitJS("the conversation to open", `document.getElementById("convtitle").textContent === `+jsString(title), 10*time.Second)
	p.waitJS("the live connection", `document.getElementById("conn").classList.contains("live")`, 10*time.Second)
}

func (p *page) send(text string) {
	p.t.Helper()
	require.NoError(p.t, chromedp.Do(p.ctx,
		chromedp.SetValue("#input", text),
		chromedp.Click("#send"),
	))
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

func hasBubble(role, text string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('.msg[data-role=%s]')].some(e => e.textContent.includes(%s))`, role, jsString(text))
}

// hasStoredBubble is hasBubble for the messages the page read from the
// API, without the reply it shows as it streams.
func hasStoredBubble(role, text string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('.msg[data-role=%s]:not(.streaming)')].some(e => e.textContent.includes(%s))`, role, jsString(text))
}

func countBubbles(role, text string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('.msg[data-role=%s]')].filter(e => e.textContent.includes(%s)).length`, role, jsString(text))
}

func (p *page) count(query string) int {
	n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](query))
	require.NoError(p.t, err)
	return n
}

func TestBrowserSendsMessageAndSeesEchoReply(t *testing.T) {
	p := startPage(t)
	p.newConversation("hello test")
	p.send("hello there")
	// The stored reply: the streamed one shows while the turn still runs.
	p.waitJS("the echo reply", hasStoredBubble("assistant", "echo: hello there"), 20*time.Second)
	p.screenshot("reply")
	require.Equal(t, 1, p.count(countBubbles("user", "hello there")))
	// The page reads the turn's state and the messages one after the
	// other, so the stored reply may show a moment before the turn's end;
	// the replied event's read brings the state level, and no older read
	// lands after it.
	p.waitJS("no thinking once the reply is in", `!document.getElementById("thinking")`, 5*time.Second)
}

func TestBrowserMessageWrittenOfflineIsSentOnceWhenAPIReturns(t *testing.T) {
	p := startPage(t)
	p.newConversation("offline")
	addr := p.addr

	p.stopAPI()
	p.waitJS("the page to notice the lost connection", `document.getElementById("conn").classList.contains("down")`, 15*time.Second)
	p.send("written offline")
	p.waitJS("the unsent message", `[...document.querySelectorAll('.msg.unsent')].some(e => e.textContent.includes("not sent yet"))`, 10*time.Second)
	require.False(t, p.js(`!!document.getElementById("thinking")`), "offline, the page must not claim that work is running")
	require.True(t, p.js(`!!document.getElementById("unknown")`), "offline, the page says the status is unknown")
	p.screenshot("offline-unsent")

	p.serve(addr)
	p.waitJS("the echo reply after reconnecting", hasBubble("assistant", "echo: written offline"), 30*time.Second)
	p.screenshot("back-online")

	var users, replies int
	require.NoError(t, p.db.Pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE role = 'user' AND content = 'written offline'),
		       count(*) FILTER (WHERE role = 'assistant' AND content = 'echo: written offline')
		FROM messages`).Scan(&users, &replies))
	require.Equal(t, 1, users, "the resend used the same message id")
	require.Equal(t, 1, replies, "exactly one reply")
	require.Equal(t, 1, p.count(countBubbles("assistant", "echo: written offline")))
}

func TestBrowserShowsFailureAfterTheCapWithRetry(t *testing.T) {
	p := startPage(t)
	p.newConversation("failing")
	p.send("/fail")
	p.waitJS("the visible error", `document.querySelectorAll('.msg[data-role=error]').length === 1`, 30*time.Second)
	p.waitJS("the retry action", `!!document.getElementById("retry")`, 10*time.Second)
	p.screenshot("failed")
	var errs int
	require.NoError(t, p.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM agent_outbox WHERE status = 'error'`).Scan(&errs))
	require.Equal(t, 1, errs)
}

func TestBrowserShowsThinkingOnlyWhileTheTurnRuns(t *testing.T) {
	p := startPage(t)
	p.newConversation("sleepy")
	p.send("/sleep 3s\nslow one")
	p.waitJS("thinking while the turn runs", `!!document.getElementById("thinking")`, 10*time.Second)
	p.screenshot("thinking")
	// The server says processing: the database agrees.
	var processing int
	require.NoError(t, p.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM agent_outbox WHERE status = 'processing'`).Scan(&processing))
	require.Equal(t, 1, processing)

	p.waitJS("the reply", hasBubble("assistant", "slow one"), 20*time.Second)
	p.waitJS("thinking gone", `!document.getElementById("thinking")`, 5*time.Second)
	p.screenshot("after")
}

func TestBrowserShowsAStreamedReplyAsItGrowsAndAVisibleFailure(t *testing.T) {
	model := agenttest.NewServer(t,
		// The first turn: the model server refuses the key, a terminal
		// failure shown in the conversation.
		agenttest.Response{Status: http.StatusUnauthorized, Body: `{"error":{"message":"invalid api key","type":"invalid_request_error"}}`},
		// The second turn: a reply written slowly, streamed to the page,
		// after the model's reasoning.
		agenttest.Response{
			Reasoning:  "The user asks why again: answer with the outbox rule.",
			Content:    "Outboxes before agents: the message and its trigger commit together, so no turn is lost.",
			ChunkSize:  4,
			ChunkDelay: 60 * time.Millisecond,
		},
	)
	p := startPage(t, func(c *consumer.Config, nc *natsclient.Conn) {
		a, err := agent.NewOpenAI(agent.Config{BaseURL: model.BaseURL(), APIKey: "wrong", Model: "test"})
		require.NoError(t, err)
		c.Agent = a
	})
	p.newConversation("streaming")
	p.send("Why an outbox?")
	p.waitJS("the visible failure", `document.querySelectorAll('.msg[data-role=error]').length === 1`, 20*time.Second)
	p.send("Tell me again, please.")
	p.waitJS("partial text while the model streams", `[...document.querySelectorAll('.msg.streaming')].some(e => e.textContent.includes("trigger"))`, 20*time.Second)
	require.False(t, p.js(hasBubble("assistant", "no turn is lost.")), "while streaming, the durable reply is not there yet")
	require.True(t, p.js(`[...document.querySelectorAll('.msg.streaming details.reasoning')].some(e => e.textContent.includes("the outbox rule") && !e.open)`),
		"the reasoning streamed before the text, in a closed block of its own")
	p.screenshot("streaming")
	p.waitJS("the committed reply", hasBubble("assistant", "so no turn is lost."), 20*time.Second)
	p.waitJS("the streaming preview gone", `document.querySelectorAll('.msg.streaming').length === 0`, 5*time.Second)
	reasoning := `document.querySelector('.msg[data-role=assistant] details.reasoning')`
	require.True(t, p.js(reasoning+`.textContent === "ReasoningThe user asks why again: answer with the outbox rule."`),
		"the committed reply keeps its reasoning, apart from its text")
	require.True(t, p.js(reasoning+`.nextSibling.textContent === "Outboxes before agents: the message and its trigger commit together, so no turn is lost."`),
		"the reasoning is no part of the reply's text, which follows it")
	require.True(t, p.js(`(`+reasoning+`.querySelector("summary").click(), true)`))
	p.waitJS("the reasoning open", reasoning+`.open`, 5*time.Second)
	p.screenshot("reasoning")
}

// storedToken is the token the page keeps.
func (p *page) storedToken() string {
	p.t.Helper()
	tok, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`localStorage.getItem("baton.token") || ""`))
	require.NoError(p.t, err)
	return tok
}

func TestBrowserLinkWithAnotherTokenDoesNotSilentlyReplaceTheStoredOne(t *testing.T) {
	p := startPage(t)
	p.newConversation("mine")
	require.Equal(t, p.token, p.storedToken())
	require.False(t, p.js(`location.hash.includes("token")`), "the token leaves the address bar")

	other, _, err := schema.CreateToken(context.Background(), p.db.Pool, "someone-else")
	require.NoError(t, err)
	link := fmt.Sprintf("http://%s/#token=%s", p.addr, other)

	// Opened from elsewhere (a new page load): the page asks and keeps
	// the token it has until the user chooses.
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Navigate("about:blank")))
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Navigate(link)))
	p.waitJS("the choice between the two tokens", `!document.getElementById("tokenchoice").classList.contains("hidden")`, 10*time.Second)
	p.waitJS("the first user's conversations", `[...document.querySelectorAll("#convs li")].some(e => e.textContent.includes("mine"))`, 10*time.Second)
	p.screenshot("token-choice")
	require.Equal(t, p.token, p.storedToken(), "a link's token does not replace the stored one by itself")
	require.False(t, p.js(`location.hash.includes("token")`), "the link's token leaves the address bar too")

	require.NoError(t, chromedp.Do(p.ctx, chromedp.Click("#keeptoken")))
	p.waitJS("the choice to close", `document.getElementById("tokenchoice").classList.contains("hidden")`, 5*time.Second)
	require.Equal(t, p.token, p.storedToken(), "keeping the current token keeps it")

	// Followed while the page is open (the fragment changes, no reload):
	// the same choice; taking the link's token starts over as the other
	// user.
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Evaluate[chromedp.Void](`location.hash = "#token=`+other+`"`)))
	p.waitJS("the choice again", `!document.getElementById("tokenchoice").classList.contains("hidden")`, 10*time.Second)
	require.Equal(t, p.token, p.storedToken())
	require.NoError(t, chromedp.Do(p.ctx, chromedp.Click("#usenewtoken")))
	p.waitJS("the other user's token in use", `localStorage.getItem("baton.token") === `+jsString(other), 10*time.Second)
	p.waitJS("the page as the other user", `!document.getElementById("app").classList.contains("hidden") && document.querySelectorAll("#convs li").length === 0`, 10*time.Second)
	require.False(t, p.js(`[...document.querySelectorAll("#convs li")].some(e => e.textContent.includes("mine"))`), "nothing of the first user stays on the page")
}

// TestBrowserShowsEveryPageOfALongConversation: the API serves messages a
// page at a time; the page follows the pages to the newest message.
func TestBrowserShowsEveryPageOfALongConversation(t *testing.T) {
	p := startPage(t)
	p.newConversation("long")
	_, err := p.db.Pool.Exec(context.Background(), `
		INSERT INTO messages (id, conversation_id, role, content)
		SELECT 'old-' || g, c.id, 'assistant', 'line ' || g
		FROM conversations c, generate_series(1, 1005) g WHERE c.title = 'long'`)
	require.NoError(t, err)
	p.send("after the backlog")
	// The stored reply, not the streamed one: the page shows the stored
	// one once it has read every page, the streamed one at once.
	p.waitJS("the reply after 1,005 older messages", hasStoredBubble("assistant", "echo: after the backlog"), 30*time.Second)
	require.Equal(t, 1, p.count(countBubbles("assistant", "line 1005")), "the last message of the second page is shown")
	require.Equal(t, 1005, p.count(countBubbles("assistant", "line ")), "every older message is shown once")
}

// TestBrowserSaysSoWhenItsTokenIsRevoked: the event stream ends with the
// reason, and the page says the token no longer works instead of
// reconnecting forever.
func TestBrowserSaysSoWhenItsTokenIsRevoked(t *testing.T) {
	p := startPage(t)
	p.newConversation("revoked")
	_, err := p.db.Pool.Exec(context.Background(), `UPDATE api_tokens SET revoked_at = now()`)
	require.NoError(t, err)
	p.waitJS("the page to say the token was revoked", `document.getElementById("conn").textContent.includes("token revoked")`, 15*time.Second)
	p.screenshot("token-revoked")
}

// truncatingAgent answers like a model that ran out of output tokens.
type truncatingAgent struct{}

func (truncatingAgent) Step(context.Context, consumer.StepRequest) (consumer.Step, error) {
	return consumer.Step{Text: "The first half of an answer", Truncated: true}, nil
}

// TestBrowserShowsAReplyTheModelCutOff: a reply stopped by the model's
// output limit is marked through the API and on the page.
func TestBrowserShowsAReplyTheModelCutOff(t *testing.T) {
	p := startPage(t, func(c *consumer.Config, _ *natsclient.Conn) { c.Agent = truncatingAgent{} })
	p.newConversation("cut")
	p.send("a long question")
	p.waitJS("the cut-off reply", hasBubble("assistant", "The first half of an answer"), 20*time.Second)
	p.waitJS("its mark", `[...document.querySelectorAll('.msg[data-role=assistant]')].some(e => e.textContent.includes("cut off"))`, 5*time.Second)
	p.screenshot("truncated")
	var truncated bool
	require.NoError(t, p.db.Pool.QueryRow(context.Background(), `SELECT truncated FROM messages WHERE role = 'assistant'`).Scan(&truncated))
	require.True(t, truncated)
}
