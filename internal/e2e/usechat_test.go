package e2e_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// repoDir is the repository's root.
func repoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// npmReady fails t, saying how to fix it, when dir's node_modules is
// missing.
func npmReady(t testing.TB, dir string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed: install Node.js 20 or later (Debian: nodejs)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		t.Fatalf("%s has no node_modules: run make test-deps (npm ci there)", dir)
	}
}

// chatModel answers the example page's messages by their text: "slow N"
// streams N numbered words steadily, "tool ..." calls the clock and then
// answers, "fail ..." is refused (the turn fails at once), "think ..."
// streams the model's reasoning before its answer, anything else is
// echoed.
// imageBytes is the size of the image the request's last user message
// carries as an image_url part, its bytes in a data URL.
func imageBytes(req agenttest.Request) (int, bool) {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "user" {
			continue
		}
		parts, _ := m.Content.([]any)
		for _, p := range parts {
			part, _ := p.(map[string]any)
			if part["type"] != "image_url" {
				continue
			}
			u, _ := part["image_url"].(map[string]any)["url"].(string)
			_, b64, _ := strings.Cut(u, ";base64,")
			data, err := base64.StdEncoding.DecodeString(b64)
			return len(data), err == nil
		}
		return 0, false
	}
	return 0, false
}

func chatModel(_ int, req agenttest.Request) agenttest.Response {
	if n, ok := imageBytes(req); ok {
		return agenttest.Response{Content: fmt.Sprintf("I see an image of %d bytes.", n)}
	}
	last := req.LastUser()
	var words int
	if _, err := fmt.Sscanf(last, "slow %d", &words); err == nil && words > 0 {
		return agenttest.Steady(words, 40*time.Millisecond)
	}
	switch {
	case strings.HasPrefix(last, "tool"):
		if len(req.ToolMessages()) == 0 {
			return agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "clock", Arguments: `{"time_zone":"UTC"}`}}}
		}
		return agenttest.Response{Content: "It is now."}
	case strings.HasPrefix(last, "fail"):
		return agenttest.Response{Status: http.StatusUnauthorized, Body: `{"error":{"message":"invalid api key"}}`}
	case strings.HasPrefix(last, "think"):
		return agenttest.Response{Reasoning: "The user wants a second thought; give one.", Content: "On second thought: yes.", ChunkSize: 5}
	case strings.HasPrefix(last, "mail"):
		// mail__send waits for approval, where the worker's MCP server
		// "mail" is named in its --mcp-approve.
		results := req.ToolMessages()
		if len(results) == 0 {
			return agenttest.Response{Content: "Checking.", ToolCalls: []agenttest.ToolCall{{ID: "call_mail", Name: "mail__send", Arguments: `{"to":"bob"}`}}}
		}
		if strings.Contains(results["call_mail"], "not made") {
			return agenttest.Response{Content: "Not sent."}
		}
		return agenttest.Response{Content: "Sent."}
	}
	return agenttest.Response{Content: "echo: " + last, ChunkSize: 4}
}

// chatSite is real Baton processes (relay, worker, API) over PostgreSQL
// and NATS, the example page served with its proxy to the API, and a
// headless Chromium.
type chatSite struct {
	*processStack
	// mail is the worker's MCP server, whose calls wait for approval.
	mail     *agenttest.MCPServer
	site     string // the page's root URL
	token    string
	browser  context.Context
	artifact string
}

func startChatSite(t *testing.T) *chatSite {
	t.Helper()
	example := filepath.Join(repoDir(), "examples", "chat-usechat")
	npmReady(t, example)
	testenv.StartPlainBatonBuild()
	s := &chatSite{artifact: artifactDir(t)}
	// The page, built from the example's sources as its build script does.
	dist := t.TempDir()
	build := exec.Command("node", "build.mjs", dist)
	build.Dir = example
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the example page: %s", out)
	serve := filepath.Join(t.TempDir(), "chat-usechat")
	gobuild := exec.Command("go", "build", "-o", serve, "./examples/chat-usechat")
	gobuild.Dir = repoDir()
	out, err = gobuild.CombinedOutput()
	require.NoError(t, err, "build the example's server: %s", out)

	model := agenttest.NewResponder(t, chatModel)
	s.mail = agenttest.NewMCPServer(t)
	s.processStack = startProcessStack(t)
	s.startWorker(model.BaseURL(), "--mcp-server", "mail="+s.mail.URL, "--mcp-approve", "mail", "--mcp-allow-private")
	sitePort, err := pgcluster.FreePort()
	require.NoError(t, err)
	siteAddr := fmt.Sprintf("127.0.0.1:%d", sitePort)
	p, err := proctest.Start("site", exec.Command(serve, "--addr", siteAddr, "--api", "http://"+s.apiAddr, "--dist", dist), proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	p.WaitLine(t, 30*time.Second, "serving")
	s.site = "http://" + siteAddr

	s.token, _, err = schema.CreateToken(context.Background(), s.db.Pool, "reader")
	require.NoError(t, err)
	alloc, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(900, 800),
	)
	t.Cleanup(cancel)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser)) // starts Chromium
	s.browser = browser
	return s
}

// tab is one browser tab on one chat of the example page.
type tab struct {
	s   *chatSite
	t   *testing.T
	ctx context.Context
}

// open opens a tab on chat.
func (s *chatSite) open(t *testing.T, chat string) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(s.browser)
	t.Cleanup(cancel)
	tb := &tab{s: s, t: t, ctx: ctx}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/?chat=%s#token=%s", s.site, chat, s.token))))
	tb.wait("the chat to load", `!!document.getElementById("input")`, 30*time.Second)
	return tb
}

func (tb *tab) wait(what, expr string, timeout time.Duration) {
	tb.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(tb.ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	tb.screenshot("timeout")
	tb.t.Fatalf("waited %s for %s (%s); last error: %v; the page shows: %s", timeout, what, expr, last, tb.str(`document.body.innerText`))
}

func (tb *tab) str(expr string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](expr))
	require.NoError(tb.t, err)
	return s
}

func (tb *tab) num(expr string) int {
	tb.t.Helper()
	n, err := chromedp.Run(tb.ctx, chromedp.Evaluate[int](expr))
	require.NoError(tb.t, err)
	return n
}

func (tb *tab) screenshot(name string) {
	buf, err := chromedp.Run(tb.ctx, chromedp.CaptureScreenshot())
	if err == nil {
		_ = os.WriteFile(filepath.Join(tb.s.artifact, strings.ReplaceAll(tb.t.Name(), "/", "-")+"-"+name+".png"), buf, 0o644)
	}
}

func (tb *tab) send(text string) {
	tb.t.Helper()
	tb.wait("the send button", `!!document.getElementById("send")`, 30*time.Second)
	require.NoError(tb.t, chromedp.Do(tb.ctx, chromedp.SendKeys("#input", text), chromedp.Click("#send")))
}

const (
	assistants = `[...document.querySelectorAll('.msg[data-role=assistant]')]`
	lastReply  = `(` + assistants + `.at(-1)?.querySelector('.text')?.textContent || "")`
)

// replyHas is a predicate: the newest reply shows word.
func replyHas(word string) string {
	return fmt.Sprintf(`%s.split(" ").includes(%q)`, lastReply, word)
}

// steady is the whole reply of "slow n".
func steady(n int) string { return agenttest.Steady(n, 0).Content }

func TestTheUseChatExampleAgainstBaton(t *testing.T) {
	s := startChatSite(t)

	t.Run("a message streams in", func(t *testing.T) {
		tb := s.open(t, "streams")
		tb.send("slow 40")
		tb.wait("the reply to stream in", replyHas("w3")+` && document.getElementById("status").textContent === "streaming"`, 30*time.Second)
		require.NotContains(t, tb.str(lastReply), "w40", "seen while it streams")
		tb.screenshot("streaming")
		tb.wait("the whole reply", lastReply+` === `+jsString(steady(40))+` && document.getElementById("status").textContent === "ready"`, 30*time.Second)
		require.Equal(t, 1, tb.num(assistants+`.length`))
	})

	t.Run("a reload mid-reply resumes with the whole reply exactly once, and a second tab shows it too", func(t *testing.T) {
		tb := s.open(t, "reload")
		tb.send("slow 80")
		tb.wait("the reply to stream in", replyHas("w10"), 30*time.Second)
		id := tb.str(assistants + `.at(-1).dataset.id`)
		other := s.open(t, "reload")
		other.wait("the second tab to show the reply", replyHas("w12"), 30*time.Second)
		require.NoError(t, chromedp.Do(tb.ctx, chromedp.Reload()))
		tb.wait("the reply to resume", replyHas("w20"), 30*time.Second)
		tb.screenshot("resumed")
		for _, x := range []*tab{tb, other} {
			x.wait("the whole reply", lastReply+` === `+jsString(steady(80)), 30*time.Second)
			require.Equal(t, 1, x.num(assistants+`.length`), "one reply")
			require.Equal(t, id, x.str(assistants+`.at(-1).dataset.id`), "under the reply's one id")
		}
		require.NoError(t, chromedp.Do(tb.ctx, chromedp.Reload()))
		tb.wait("the history after the reply", lastReply+` === `+jsString(steady(80)), 30*time.Second)
		require.Equal(t, 1, tb.num(assistants+`.length`), "the history shows the reply once")
	})

	t.Run("the API restarted mid-reply, the page recovers the reply", func(t *testing.T) {
		tb := s.open(t, "restart")
		tb.send("slow 100")
		tb.wait("the reply to stream in", replyHas("w10"), 30*time.Second)
		s.api.Kill()
		s.startAPI()
		tb.wait("the whole reply after the restart", lastReply+` === `+jsString(steady(100)), 60*time.Second)
		tb.screenshot("recovered")
		require.Equal(t, 1, tb.num(assistants+`.length`))
	})

	t.Run("Stop ends the reply and no reply comes later", func(t *testing.T) {
		tb := s.open(t, "stop")
		tb.send("slow 300")
		tb.wait("the reply to stream in", replyHas("w5"), 30*time.Second)
		require.NoError(t, chromedp.Do(tb.ctx, chromedp.Click("#stop")))
		tb.wait("the reply marked stopped", assistants+`.at(-1).querySelector(".stopped") !== null && document.getElementById("status").textContent === "ready"`, 15*time.Second)
		tb.screenshot("stopped")
		shown := tb.str(lastReply)
		require.NotContains(t, shown, "w300")
		var stored string
		require.NoError(t, s.db.Pool.QueryRow(context.Background(),
			`SELECT content FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.public_id = 'stop' AND m.stopped`).Scan(&stored))
		require.Equal(t, stored, shown, "the page shows the stopped reply as stored")
		// A message after the stop is answered; by then any late reply of
		// the stopped turn would have come.
		tb.send("after the stop")
		tb.wait("the next reply", lastReply+` === "echo: after the stop"`, 30*time.Second)
		require.Equal(t, 2, tb.num(assistants+`.length`))
		require.Equal(t, shown, tb.str(assistants+`[0].querySelector('.text').textContent`), "the stopped reply did not change")
	})

	t.Run("a failed turn shows its error", func(t *testing.T) {
		tb := s.open(t, "failing")
		tb.send("fail now")
		tb.wait("the error", `(document.getElementById("error")?.textContent || "").includes("not allowed to use its model")`, 30*time.Second)
		tb.screenshot("failed")
	})

	t.Run("a tool call shows its input and output", func(t *testing.T) {
		tb := s.open(t, "tools")
		tb.send("tool time")
		tb.wait("the tool call's output", `!!document.querySelector('.tool[data-tool=clock][data-state=output-available] .tool-output')`, 30*time.Second)
		tb.wait("the reply after it", lastReply+` === "It is now."`, 30*time.Second)
		tb.screenshot("tool")
		require.Equal(t, `{"time_zone":"UTC"}`, tb.str(`document.querySelector('.tool .tool-input').textContent`))
		require.Contains(t, tb.str(`document.querySelector('.tool .tool-output').textContent`), "T")
	})

	t.Run("the model's reasoning shows apart from the reply, also in the history", func(t *testing.T) {
		tb := s.open(t, "think")
		tb.send("think twice")
		reasoning := assistants + `.at(-1)?.querySelector('details.reasoning')?.textContent`
		tb.wait("the reasoning and the reply", reasoning+` === "ReasoningThe user wants a second thought; give one." && `+lastReply+` === "On second thought: yes."`, 30*time.Second)
		tb.screenshot("reasoning")
		require.NoError(t, chromedp.Do(tb.ctx, chromedp.Reload()))
		tb.wait("the history's reasoning and reply", reasoning+` === "ReasoningThe user wants a second thought; give one." && `+lastReply+` === "On second thought: yes."`, 30*time.Second)
		require.Equal(t, 1, tb.num(assistants+`.length`))
	})

	t.Run("a call that waits for approval shows Approve and Deny; Approve sends it once and the reply goes on", func(t *testing.T) {
		tb := s.open(t, "approve")
		tb.send("mail bob")
		tb.wait("the call with Approve and Deny", `!!document.querySelector('.tool[data-tool=mail__send][data-state=approval-requested] button.deny')`, 30*time.Second)
		tb.screenshot("approval")
		require.Equal(t, `{"to":"bob"}`, tb.str(`document.querySelector('.tool[data-tool=mail__send] .tool-input').textContent`))
		require.Empty(t, s.mail.Calls(), "nothing is sent before the approval")
		require.NoError(t, chromedp.Do(tb.ctx, chromedp.Click(".tool[data-tool=mail__send] button.approve")))
		tb.wait("the call's output and the reply after it", `!!document.querySelector('.tool[data-tool=mail__send][data-state=output-available] .tool-output')`+
			` && `+assistants+`.at(-1).textContent.includes("Sent.") && document.getElementById("status").textContent === "ready"`, 30*time.Second)
		tb.screenshot("approved")
		require.Equal(t, []string{`{"to":"bob"}`}, s.mail.Calls(), "the approved call was sent once")
		require.Equal(t, 1, tb.num(assistants+`.length`), "one reply, which went on")
		require.Equal(t, 1, tb.num(`(`+assistants+`.at(-1).textContent.match(/Checking\./g) || []).length`), "no text twice")
	})

	t.Run("the reference page's Stop button stops a turn", func(t *testing.T) {
		ctx, cancel := chromedp.NewContext(s.browser)
		t.Cleanup(cancel)
		tb := &tab{s: s, t: t, ctx: ctx}
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("http://%s/#token=%s", s.apiAddr, s.token))))
		tb.wait("the page", `!document.getElementById("app").classList.contains("hidden")`, 20*time.Second)
		require.NoError(t, chromedp.Do(ctx, chromedp.SetValue("#newtitle", "stoppable"), chromedp.Click("#newconv button")))
		tb.wait("the conversation", `document.getElementById("convtitle").textContent === "stoppable" && document.getElementById("conn").classList.contains("live")`, 20*time.Second)
		require.NoError(t, chromedp.Do(ctx, chromedp.SetValue("#input", "slow 300"), chromedp.Click("#send")))
		tb.wait("the streamed text", `[...document.querySelectorAll('.msg.streaming')].some(e => e.textContent.includes("w3"))`, 30*time.Second)
		// The page draws its state again at each delta: the button is
		// clicked where it is at that moment.
		tb.wait("the Stop button, clicked", `(() => { const b = document.getElementById("stop"); if (b) b.click(); return !!b; })()`, 10*time.Second)
		tb.wait("the stopped reply", `[...document.querySelectorAll('.msg[data-role=assistant]')].some(e => e.textContent.includes("w3") && e.textContent.includes("stopped"))`, 15*time.Second)
		tb.screenshot("reference-stopped")
		require.False(t, tb.num(`document.querySelectorAll("#stop").length`) > 0, "nothing runs any more")
	})
}
