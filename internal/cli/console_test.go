package cli_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
)

// TestConsoleSignsInTheOperatorTokenOfTokenCreateAndRefusesAUsersToken
// runs `baton console` as an operator would: `baton token create --admin`
// makes an operator token that signs in to it (and is listed as one),
// a user's token gets 403, and nothing the console wrote holds a secret.
func TestConsoleSignsInTheOperatorTokenOfTokenCreateAndRefusesAUsersToken(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	out, errOut, code := run(t, "token", "create", "--database-url", db.URL, "--user", "ops-ada", "--admin")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "created console admin token")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	admin := lines[len(lines)-1]
	out, errOut, code = run(t, "token", "create", "--database-url", db.URL, "--user", "alice")
	require.Zero(t, code, errOut)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	user := lines[len(lines)-1]
	out, errOut, code = run(t, "token", "list", "--database-url", db.URL, "--user", "ops-ada")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "console-admin")
	_, errOut, code = run(t, "token", "create", "--database-url", db.URL, "--user", "x", "--admin", "--viewer")
	require.Equal(t, 2, code, "--admin and --viewer exclude each other: %s", errOut)

	port, err := pgcluster.FreePort()
	require.NoError(t, err)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s := runService(t, "console", "console", "--addr", fmt.Sprintf("127.0.0.1:%d", port),
		"--database-url", db.URL, "--nats-url", n.URL, "--refresh", "1s")
	require.Eventually(t, func() bool {
		s.running(t)
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "the console serves")

	signIn := func(token string) (*http.Client, int) {
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		c := &http.Client{Jar: jar}
		resp, err := c.Get(base + "/signin")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		nonce := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(string(body))
		require.NotNil(t, nonce, string(body))
		resp, err = c.PostForm(base+"/signin", url.Values{"csrf": {nonce[1]}, "token": {token}})
		require.NoError(t, err)
		resp.Body.Close()
		return c, resp.StatusCode
	}
	_, status := signIn(user)
	require.Equal(t, http.StatusForbidden, status, "a user's token gets 403")
	c, status := signIn(admin)
	require.Equal(t, http.StatusOK, status, "the admin's token signs in and lands on the overview")
	resp, err := c.Get(base + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "ops-ada")
	require.Contains(t, string(body), "turns running")
	for _, secret := range []string{db.URL, admin, user} {
		require.NotContains(t, string(body), secret)
		require.NotContains(t, s.stderr.String(), secret, "the console's log holds a secret")
	}
	require.Contains(t, s.stderr.String(), `"component":"console"`)
}
