package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/console"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// bundle is a console over a real stack: PostgreSQL, NATS, the relay and a
// worker whose agent the test controls.
type bundle struct {
	t       *testing.T
	db      *testenv.DB
	srv     *console.Server
	web     *httptest.Server
	user    schema.User
	failing *atomic.Bool
}

type options struct {
	cfg     console.Config
	tools   consumer.Tools
	noStack bool
	// log, when set, also receives the console's log.
	log io.Writer
	// failing, when set, is the bundle's failing: the agent fails while
	// it is set.
	failing *atomic.Bool
}

// flaky is the echo agent that fails while failing is set.
type flaky struct {
	consumer.Echo
	failing *atomic.Bool
}

func (f flaky) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	if f.failing.Load() {
		return consumer.Step{}, errors.New("the model is down")
	}
	return f.Echo.Step(ctx, req)
}

func setup(t *testing.T, o options) *bundle {
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
	b := &bundle{t: t, db: db, failing: o.failing}
	if b.failing == nil {
		b.failing = &atomic.Bool{}
	}
	if !o.noStack {
		_, _, err = batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			done <- cli.RunStack(ctx, cli.StackConfig{
				Relay: relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
				Worker: consumer.Config{
					Agent: flaky{Echo: consumer.Echo{Directives: true}, failing: b.failing}, Tools: o.tools,
					MaxAttempts: 1, Lease: 5 * time.Second, RetryDelay: 50 * time.Millisecond, Debounce: 20 * time.Millisecond,
				},
			}, db.Pool, nc)
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("stack: %v", err)
			}
		})
	}
	cfg := o.cfg
	var out io.Writer = zerolog.NewTestWriter(t)
	if o.log != nil {
		out = io.MultiWriter(out, o.log)
	}
	log := zerolog.New(out)
	cfg.Logger = &log
	cfg.Slot, cfg.Stream = "slot_"+db.Name, batonnats.DefaultStream
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = time.Second
	}
	b.srv, err = console.New(cfg, db.Pool, js)
	require.NoError(t, err)
	b.web = httptest.NewServer(b.srv.Handler())
	t.Cleanup(b.web.Close)
	_, b.user, err = schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	return b
}

// operatorToken makes an operator token.
func (b *bundle) operatorToken(name string, role schema.OperatorRole) string {
	b.t.Helper()
	tok, _, err := schema.CreateOperatorToken(context.Background(), b.db.Pool, name, role, time.Time{})
	require.NoError(b.t, err)
	return tok
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so that a test sees each answer.
type browser struct {
	b *bundle
	c *http.Client
}

func (b *bundle) browser() *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(b.t, err)
	return &browser{b: b, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// page is an answer: its status, where it redirects, and its body.
type page struct {
	status   int
	location string
	body     string
	header   http.Header
}

func (br *browser) do(req *http.Request) page {
	br.b.t.Helper()
	resp, err := br.c.Do(req)
	require.NoError(br.b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(br.b.t, err)
	return page{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(body), header: resp.Header}
}

func (br *browser) get(path string) page {
	br.b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, br.b.web.URL+path, nil)
	require.NoError(br.b.t, err)
	return br.do(req)
}

func (br *browser) post(path string, form url.Values) page {
	br.b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, br.b.web.URL+path, strings.NewReader(form.Encode()))
	require.NoError(br.b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return br.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token of the first form of a page.
func (br *browser) csrf(path string) string {
	br.b.t.Helper()
	p := br.get(path)
	require.Equal(br.b.t, http.StatusOK, p.status, "GET %s: %s", path, p.body)
	m := csrfField.FindStringSubmatch(p.body)
	require.NotNil(br.b.t, m, "%s has a form with a CSRF token", path)
	return m[1]
}

// signIn signs in with token through the form and returns the answer.
func (br *browser) signIn(token string) page {
	br.b.t.Helper()
	nonce := br.csrf("/signin")
	return br.post("/signin", url.Values{"csrf": {nonce}, "token": {token}})
}

// signedIn is a browser signed in with token.
func (b *bundle) signedIn(token string) *browser {
	b.t.Helper()
	br := b.browser()
	p := br.signIn(token)
	require.Equal(b.t, http.StatusSeeOther, p.status, "sign-in: %s", p.body)
	require.Equal(b.t, "/", p.location)
	return br
}

// send posts a user message through the one write path and returns the
// conversation's key.
func (b *bundle) send(conversation, message, content string) string {
	b.t.Helper()
	ctx := context.Background()
	var key string
	require.NoError(b.t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, _, err := schema.CreateConversation(ctx, tx, b.user.ID, conversation, "A title"); err != nil {
			return err
		}
		res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: b.user.ID, ConversationID: conversation, MessageID: message, Content: content})
		key = res.ConversationKey
		return err
	}))
	return key
}

// waitStatus waits until the conversation's newest outbox row has status.
func (b *bundle) waitStatus(key, status string) {
	b.t.Helper()
	testenv.Eventually(b.t, 20*time.Second, func() bool {
		var s string
		err := b.db.Pool.QueryRow(context.Background(), `SELECT status FROM agent_outbox WHERE conversation_id = $1 ORDER BY id DESC LIMIT 1`, key).Scan(&s)
		return err == nil && s == status
	}, "the newest outbox row of %s becomes %s", key, status)
}

// actions lists operator_actions as "operator action target".
func (b *bundle) actions() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT operator || ' ' || action || ' ' || target FROM operator_actions ORDER BY id`)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b.t, err)
	return out
}

// withCookie is a browser that sends a cookie of its own.
func (b *bundle) withCookie(name, value string) *browser {
	br := b.browser()
	u, err := url.Parse(b.web.URL)
	require.NoError(b.t, err)
	br.c.Jar.SetCookies(u, []*http.Cookie{{Name: name, Value: value}})
	return br
}
