package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/oidctest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
)

// appPage is the page of an application on an origin of its own; its
// script calls Baton cross-origin (see TestBrowserOnAnAllowedOriginPostsAndStreamsWithAJWT).
const appPage = `<!doctype html><html><head><meta charset="utf-8"><title>app</title></head><body><p id="out">app</p></body></html>`

// converseScript posts a message as a browser's code would, with the JWT
// in Authorization, and reads the conversation's event stream through
// fetch (which, unlike EventSource, can send Authorization) until the
// reply is in; it returns the reply, or the error the browser gave.
const converseScript = `(async () => {
  const api = %q, token = %q;
  const auth = {'Authorization': 'Bearer ' + token};
  const json = {...auth, 'Content-Type': 'application/json'};
  try {
    let r = await fetch(api + '/v1/conversations', {method: 'POST', headers: json, body: JSON.stringify({id: 'cors-demo'})});
    if (r.status !== 201) return 'create: ' + r.status;
    const events = await fetch(api + '/v1/conversations/cors-demo/events', {headers: auth});
    if (events.status !== 200) return 'events: ' + events.status;
    const reader = events.body.pipeThrough(new TextDecoderStream()).getReader();
    let seen = '';
    const until = async (word) => {
      while (!seen.includes(word)) {
        const {value, done} = await reader.read();
        if (done) throw new Error('the stream ended before ' + word);
        seen += value;
      }
    };
    await until('event: ready');
    r = await fetch(api + '/v1/conversations/cors-demo/messages', {method: 'POST', headers: json, body: JSON.stringify({id: 'm1', content: 'hello from the app'})});
    if (r.status !== 202) return 'post: ' + r.status;
    await until('"type":"replied"');
    reader.cancel();
    const msgs = await (await fetch(api + '/v1/conversations/cors-demo/messages', {headers: auth})).json();
    return msgs.messages.filter(m => m.role === 'assistant').map(m => m.content).join('|');
  } catch (e) {
    return 'error: ' + e;
  }
})()`

// serveOrigin serves the app page on a port of its own, which makes it an
// origin of its own, and returns that origin.
func serveOrigin(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(appPage))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String()
}

// TestBrowserOnAnAllowedOriginPostsAndStreamsWithAJWT: headless Chromium
// on a page of the application's own origin, listed in CORSOrigins,
// creates a conversation, opens its event stream and posts a message with
// a JWT its backend minted (HS256), and reads the echo reply; the same
// script on a page of an origin that is not listed gets nothing.
func TestBrowserOnAnAllowedOriginPostsAndStreamsWithAJWT(t *testing.T) {
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
	stackDone := make(chan error, 1)
	go func() {
		stackDone <- cli.RunStack(ctx, cli.StackConfig{
			Relay:  relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
			Worker: consumer.Config{Agent: consumer.Echo{}, Debounce: 50 * time.Millisecond},
		}, db.Pool, nc)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-stackDone; err != nil {
			t.Errorf("stack: %v", err)
		}
	})

	app, stranger := serveOrigin(t), serveOrigin(t)
	secret := []byte(strings.Repeat("app-backend-secret-", 3))
	srv, err := api.New(api.Config{CORSOrigins: []string{app},
		JWT: jwtauth.Config{HS256Secret: secret, HS256Issuer: "https://app.example/", Audience: "https://api.baton.test"}}, db.Pool, js)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer()
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	base := "http://" + ln.Addr().String()

	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	// The browser starts under its own context: the timeouts below end a
	// script, not the browser.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank")))

	converse := func(origin, user string) string {
		t.Helper()
		token := oidctest.HS256(t, secret, oidctest.Claims("https://app.example/", user, "https://api.baton.test", 5*time.Minute))
		runCtx, cancelRun := context.WithTimeout(bctx, 60*time.Second)
		defer cancelRun()
		require.NoError(t, chromedp.Do(runCtx, chromedp.Navigate(origin+"/")))
		out, err := chromedp.Run(runCtx, chromedp.Evaluate[string](fmt.Sprintf(converseScript, base, token), chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		return out
	}
	require.Equal(t, "echo: hello from the app", converse(app, "ada"),
		"the page on the allowed origin %s posts with its JWT and reads the reply from the event stream", app)
	got := converse(stranger, "eve")
	require.True(t, strings.HasPrefix(got, "error: TypeError"), "the page on %s, an origin not listed, must get nothing from the API; got %q", stranger, got)
	var users int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM users WHERE name = 'https://app.example/|eve'`).Scan(&users))
	require.Zero(t, users, "the refused preflight kept the other origin's request from running")
}
