package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// setupEdge serves the API with the http.Server that `baton api` runs
// (api.Server.HTTPServer: its timeouts and header limit), with cfg's
// limits and js (nil: no live events), on a real TCP listener.
func setupEdge(t testing.TB, cfg api.Config, js jetstream.JetStream) *bundle {
	t.Helper()
	pool := testenv.Database(t).Pool
	ctx := context.Background()
	a, alice, err := schema.CreateToken(ctx, pool, "alice")
	require.NoError(t, err)
	b, _, err := schema.CreateToken(ctx, pool, "bob")
	require.NoError(t, err)
	s, err := api.New(cfg, pool, js)
	require.NoError(t, err)
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = s.HTTPServer()
	hs.Start()
	t.Cleanup(func() { s.Close(); hs.Close() })
	return &bundle{pool: pool, srv: hs, alice: a, bob: b, aliceID: alice.ID, client: hs.Client()}
}

func (b *bundle) addr() string { return b.srv.Listener.Addr().String() }

// dial opens a raw connection to the server and writes what a client
// sends.
func (b *bundle) dial(t *testing.T, send string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	if send != "" {
		_, err = io.WriteString(conn, send)
		require.NoError(t, err)
	}
	return conn
}

// requireClosedWithin reads from r until the server closes the connection
// and returns what it sent; it fails t when the connection is still open
// after d.
func requireClosedWithin(t *testing.T, conn net.Conn, r io.Reader, d time.Duration, what string) string {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(d)))
	got, err := io.ReadAll(r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the connection was still open after %s (received %q)", what, d, got)
	}
	// A reset is a close too.
	return string(got)
}

// shortTimeouts are timeouts short enough for tests.
func shortTimeouts() api.Config {
	return api.Config{
		HeaderTimeout: 300 * time.Millisecond,
		ReadTimeout:   500 * time.Millisecond,
		WriteTimeout:  2 * time.Second,
		IdleTimeout:   500 * time.Millisecond,
	}
}

// margin is how much later than its timeout a connection may close, for
// a loaded machine running the race detector.
const margin = 5 * time.Second

func TestHeadersThatNeverEndAreCutOffAtTheHeaderTimeout(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, shortTimeouts(), nil)
	conn := b.dial(t, "POST /v1/conversations HTTP/1.1\r\nHost: baton\r\nContent-Type: application/json\r\n")
	got := requireClosedWithin(t, conn, conn, 300*time.Millisecond+margin, "headers sent, then nothing")
	require.Empty(t, got, "nothing is answered to a request that never ended its headers")
}

func TestABodyDeclaredButNeverSentGets408AndTheConnectionCloses(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, shortTimeouts(), nil)
	b.createConversation(t, b.alice, "c1")
	before := counts(t, b.pool)
	conn := b.dial(t, "POST /v1/conversations/c1/messages HTTP/1.1\r\nHost: baton\r\n"+
		"Authorization: Bearer "+b.alice+"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
	got := requireClosedWithin(t, conn, conn, 500*time.Millisecond+margin, "Content-Length: 100000 and no body")
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 408 "), "the server says the body did not arrive in time: %q", got)
	require.Contains(t, got, `"code":"request_timeout"`)
	require.Contains(t, got, "Connection: close")
	require.Equal(t, before, counts(t, b.pool))
}

func TestARefusedRequestWithAnUnsentBodyIsAnsweredAtOnceAndClosed(t *testing.T) {
	t.Parallel()
	// A read timeout far longer than the wait below: the answer must not
	// wait for the body.
	cfg := shortTimeouts()
	cfg.ReadTimeout = time.Minute
	b := setupEdge(t, cfg, nil)
	conn := b.dial(t, "POST /v1/conversations/c1/messages HTTP/1.1\r\nHost: baton\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
	got := requireClosedWithin(t, conn, conn, margin, "an unauthenticated request with a body it never sends")
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 401 "), "%q", got)
	require.Contains(t, got, `"code":"unauthorized"`)
}

func TestABodyTrickledByteByByteIsCutOffAtTheReadTimeout(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, shortTimeouts(), nil)
	b.createConversation(t, b.alice, "c1")
	before := counts(t, b.pool)
	conn := b.dial(t, "POST /v1/conversations/c1/messages HTTP/1.1\r\nHost: baton\r\n"+
		"Authorization: Bearer "+b.alice+"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	got := requireClosedWithin(t, conn, conn, 500*time.Millisecond+margin, "a body trickled one byte at a time")
	close(stop)
	<-trickled
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 408 "), "%q", got)
	require.Contains(t, got, `"code":"request_timeout"`)
	require.Equal(t, before, counts(t, b.pool))
}

func TestAnIdleKeepAliveConnectionIsClosedAtTheIdleTimeout(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, shortTimeouts(), nil)
	conn := b.dial(t, "GET /healthz HTTP/1.1\r\nHost: baton\r\n\r\n")
	br := bufio.NewReader(conn)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(margin)))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.False(t, resp.Close, "the connection is kept alive after a complete request")

	got := requireClosedWithin(t, conn, br, 500*time.Millisecond+margin, "an idle keep-alive connection")
	require.Empty(t, got)
}

func TestHeadersOverTheLimitGet431(t *testing.T) {
	t.Parallel()
	cfg := shortTimeouts()
	cfg.MaxHeaderBytes = 2048
	b := setupEdge(t, cfg, nil)

	// Just over the limit: the API's JSON answer.
	conn := b.dial(t, "GET /healthz HTTP/1.1\r\nHost: baton\r\nX-Filler: "+strings.Repeat("a", 2048)+"\r\n\r\n")
	got := requireClosedWithin(t, conn, conn, margin, "headers just over the limit")
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 431 "), "%q", got)
	require.Contains(t, got, `"code":"headers_too_large"`)

	// Far over it: net/http stops reading and answers 431 itself.
	conn = b.dial(t, "GET /healthz HTTP/1.1\r\nHost: baton\r\nX-Filler: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	got = requireClosedWithin(t, conn, conn, margin, "headers far over the limit")
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 431 "), "%q", got)

	// Under it: served.
	require.Equal(t, http.StatusOK, b.do(t, "", "GET", "/healthz", nil).Status)
}

func TestAnEventStreamOutlivesTheReadAndWriteTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	cfg := shortTimeouts()
	// Short, yet long enough for the test's own requests to be answered
	// within them on a loaded machine: they are cut off at the timeouts.
	cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second
	b := setupEdge(t, cfg, js)
	b.createConversation(t, b.alice, "c1")

	s := openSSE(t, b.srv.URL+convPath("c1", "/events"), b.alice, "")
	require.Equal(t, "ready", s.next(t).Event)
	// Both timeouts pass while the stream is open...
	<-time.After(5 * cfg.WriteTimeout / 2)
	// ...and it still delivers.
	require.Equal(t, http.StatusAccepted, b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "hi"}).Status)
	var ev batonnats.ConversationEvent
	require.NoError(t, json.Unmarshal([]byte(s.next(t).Data), &ev))
	require.Equal(t, batonnats.EventMessage, ev.Type)
}

func TestAFloodingUserIsRateLimitedWhileAnotherUserPostsFreely(t *testing.T) {
	t.Parallel()
	b := setupEdge(t, api.Config{MessagesPerMinute: 1, MessageBurst: 3}, nil)
	b.createConversation(t, b.alice, "flood")
	b.createConversation(t, b.bob, "calm")

	for i := range 3 {
		r := b.do(t, b.alice, "POST", convPath("flood", "/messages"), map[string]any{"id": fmt.Sprintf("m%d", i), "content": "spam"})
		require.Equal(t, http.StatusAccepted, r.Status, "message %d is within the burst: %s", i, r.Raw)
	}
	before := counts(t, b.pool)
	req, err := http.NewRequest("POST", b.srv.URL+convPath("flood", "/messages"), strings.NewReader(`{"id":"m3","content":"spam"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.alice)
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", raw)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After is a number of seconds: %q", resp.Header.Get("Retry-After"))
	require.True(t, secs >= 1 && secs <= 60, "one message a minute: the next one within 60 s, not %d", secs)
	var body struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Equal(t, "rate_limited", body.Error.Code)
	require.Contains(t, body.Error.Message, "try again in")
	require.Equal(t, before, counts(t, b.pool), "a refused message stores nothing")

	for i := range 3 {
		r := b.do(t, b.bob, "POST", convPath("calm", "/messages"), map[string]any{"id": fmt.Sprintf("b%d", i), "content": "hello"})
		require.Equal(t, http.StatusAccepted, r.Status, "another user's messages are accepted while the first one floods: %s", r.Raw)
	}
}

// openStream opens an event stream and returns its status; a 200 stream
// stays open until the returned close.
func (b *bundle) openStream(t *testing.T, token, cid string) (int, http.Header, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", b.srv.URL+convPath(cid, "/events"), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	closeIt := func() { cancel(); resp.Body.Close() }
	t.Cleanup(closeIt)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return resp.StatusCode, resp.Header, closeIt
}

func TestTheNinthStreamOfOneUserIsRefusedWhileAnotherUserOpensOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	b := setupEdge(t, api.Config{}, js)
	b.createConversation(t, b.alice, "a")
	b.createConversation(t, b.bob, "b")

	var closers []func()
	for i := range api.DefaultMaxStreamsPerUser {
		status, _, closeIt := b.openStream(t, b.alice, "a")
		require.Equal(t, http.StatusOK, status, "stream %d of %d", i+1, api.DefaultMaxStreamsPerUser)
		closers = append(closers, closeIt)
	}
	status, h, _ := b.openStream(t, b.alice, "a")
	require.Equal(t, http.StatusTooManyRequests, status, "one stream over the user's limit")
	require.NotEmpty(t, h.Get("Retry-After"))

	status, _, _ = b.openStream(t, b.bob, "b")
	require.Equal(t, http.StatusOK, status, "another user still opens a stream")

	// A closed stream gives its slot back.
	closers[0]()
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, _, _ = b.openStream(t, b.alice, "a")
		if status == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusTooManyRequests, status)
		require.True(t, time.Now().Before(deadline), "the closed stream's slot was not given back within 10s")
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReadyzWithAnUnreachableDatabaseSaysNothingAboutIt(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://baton_reader:s3cret@127.0.0.1:%d/batondb?connect_timeout=1", addr.Port))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var log lockedBuffer
	logger := zerolog.New(&log)
	s, err := api.New(api.Config{Logger: &logger}, pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	resp, err := http.Get(hs.URL + "/readyz")
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.JSONEq(t, `{"error":{"code":"not_ready","message":"not ready to serve requests"}}`, string(raw))
	for _, secret := range []string{"127.0.0.1", strconv.Itoa(addr.Port), "batondb", "baton_reader", "s3cret", "dial", "connect", "refused", "postgres"} {
		require.NotContains(t, string(raw), secret)
	}
	require.Contains(t, log.String(), "not ready", "the cause goes to the log")
}

func TestMetricsAreNotServedOnTheAPIPort(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createConversation(t, b.alice, "c1")
	r := b.do(t, "", "GET", "/metrics", nil)
	require.Equal(t, http.StatusNotFound, r.Status)
	require.NotContains(t, r.Raw, "baton_api_requests_total")
}

// lockedBuffer is a log that the server writes and the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
