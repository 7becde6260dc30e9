package cli_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// waitHTTP polls url until it answers, for a server started in the
// background.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return
		}
		require.True(t, time.Now().Before(deadline), "%s did not answer within 30s: %v", url, err)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAPIServesMetricsOnlyOnTheMetricsAddressAndAppliesItsLimits(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	token, _ := createToken(t, db.URL, "alice")
	stop := start(t, "api", "--database-url", db.URL, "--nats-url", n.URL, "--http-addr", apiAddr,
		"--metrics-addr", metricsAddr, "--max-header-bytes", "2048", "--idle-timeout", "300ms", "--message-burst", "1")
	waitHTTP(t, "http://"+apiAddr+"/healthz")

	code, _ := call(t, "POST", "http://"+apiAddr+"/v1/conversations", token, `{"id":"c1"}`)
	require.Equal(t, http.StatusCreated, code)
	code, _ = call(t, "POST", "http://"+apiAddr+"/v1/conversations/c1/messages", token, `{"id":"m1","content":"hi"}`)
	require.Equal(t, http.StatusAccepted, code)
	code, body := call(t, "POST", "http://"+apiAddr+"/v1/conversations/c1/messages", token, `{"id":"m2","content":"hi"}`)
	require.Equal(t, http.StatusTooManyRequests, code, "--message-burst 1: the second message at once is refused: %v", body)

	resp, err := http.Get("http://" + apiAddr + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "no metrics on the API's port")
	resp, err = http.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(raw), `baton_api_requests_total{code="201",route="POST /v1/conversations"} 1`)
	require.Contains(t, string(raw), `baton_api_limited_total{limit="messages"} 1`)

	// --max-header-bytes
	conn, err := net.Dial("tcp", apiAddr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: baton\r\nX-Filler: "+strings.Repeat("a", 2048)+"\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)

	// --idle-timeout
	conn, err = net.Dial("tcp", apiAddr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: baton\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the idle connection was closed well before 10s: %v", err)

	code, stderr := stop()
	require.Equal(t, 0, code, stderr)
}

func TestAPILimitFlagsThatCannotWorkAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--read-timeout", "1ms"}, "--read-timeout / BATON_HTTP_READ_TIMEOUT 1ms: must be at least 10ms"},
		{[]string{"--header-timeout=-1s"}, "--header-timeout / BATON_HTTP_HEADER_TIMEOUT"},
		{[]string{"--max-header-bytes", "100"}, "--max-header-bytes / BATON_MAX_HEADER_BYTES 100"},
		{[]string{"--messages-per-minute=-5"}, "--messages-per-minute / BATON_MESSAGES_PER_MINUTE -5: must be at least 1"},
		{[]string{"--max-streams", "4", "--max-streams-per-user", "8"}, "--max-streams-per-user / BATON_MAX_STREAMS_PER_USER 8"},
		{[]string{"--max-content-bytes", "1048577"}, "--max-content-bytes / BATON_MAX_CONTENT_BYTES must be 1 to 1048576"},
		{[]string{"--double-texting", "shout"}, `--double-texting / BATON_DOUBLE_TEXTING "shout" is not a policy: give enqueue, reject, interrupt or debounce`},
	} {
		for _, cmd := range []string{"api", "dev"} {
			_, stderr, code := run(t, append([]string{cmd, "--database-url", "postgres://127.0.0.1:1/none"}, tc.args...)...)
			require.Equal(t, 2, code, "%s %v: %s", cmd, tc.args, stderr)
			require.Contains(t, stderr, tc.want, "%s %v", cmd, tc.args)
		}
	}
}
