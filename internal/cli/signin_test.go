package cli_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/oidctest"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
)

// secretFile writes content to a file of the test's and returns its path.
func secretFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hs256.secret")
	require.NoError(t, os.WriteFile(path, []byte(content+"\n"), 0o600))
	return path
}

// TestSignInSettingsThatCannotWorkAreUsageErrorsThatNeverShowTheSecret:
// api, dev and status refuse, before anything connects, a plain HTTP
// issuer without --jwt-allow-http, an issuer with "|", JWTs without an
// audience, a JWKS URL without its issuer, an HS256 secret without its
// issuer (or with the provider's), a short or missing secret file, and a
// wildcard or a path in --cors-origins; each error names the flag, and
// none shows the secret file's content.
func TestSignInSettingsThatCannotWorkAreUsageErrorsThatNeverShowTheSecret(t *testing.T) {
	t.Parallel()
	const shortSecret = "short-secret-0123"
	short := secretFile(t, shortSecret)
	good := secretFile(t, strings.Repeat("k", 48))
	for _, tc := range []struct {
		args []string
		want string
		cors bool
	}{
		{[]string{"--jwt-issuer", "http://idp.example/", "--jwt-audience", "a"}, "--jwt-issuer / BATON_JWT_ISSUER http://idp.example/: must use https://: plain HTTP lets anyone on the path swap the keys (--jwt-allow-http allows it for development)", false},
		{[]string{"--jwt-issuer", "https://idp.example/a|b", "--jwt-audience", "a"}, `--jwt-issuer / BATON_JWT_ISSUER https://idp.example/a|b: must not contain "|"`, false},
		{[]string{"--jwt-issuer", "https://idp.example/"}, "--jwt-audience / BATON_JWT_AUDIENCE", false},
		{[]string{"--jwt-jwks-url", "https://idp.example/jwks", "--jwt-audience", "a"}, "--jwt-jwks-url / BATON_JWT_JWKS_URL https://idp.example/jwks: needs the issuer too", false},
		{[]string{"--jwt-hs256-secret-file", good, "--jwt-audience", "a"}, "--jwt-hs256-issuer / BATON_JWT_HS256_ISSUER", false},
		{[]string{"--jwt-hs256-secret-file", good, "--jwt-hs256-issuer", "https://idp.example/", "--jwt-issuer", "https://idp.example/", "--jwt-audience", "a"}, "must differ from the OpenID Connect issuer", false},
		{[]string{"--jwt-hs256-secret-file", short, "--jwt-hs256-issuer", "https://app.example/", "--jwt-audience", "a"}, "--jwt-hs256-secret-file / BATON_JWT_HS256_SECRET_FILE (17 bytes): must be at least 32 bytes", false},
		{[]string{"--jwt-hs256-secret-file", filepath.Join(t.TempDir(), "missing"), "--jwt-hs256-issuer", "https://app.example/", "--jwt-audience", "a"}, "--jwt-hs256-secret-file / BATON_JWT_HS256_SECRET_FILE: cannot read the secret file", false},
		{[]string{"--cors-origins", "*"}, "--cors-origins / BATON_CORS_ORIGINS *: wildcards are not allowed", true},
		{[]string{"--cors-origins", "https://app.example,https://app.example/chat"}, "--cors-origins / BATON_CORS_ORIGINS https://app.example/chat: must be an origin", true},
	} {
		cmds := []string{"api", "dev", "status"}
		if tc.cors {
			cmds = cmds[:2]
		}
		for _, cmd := range cmds {
			stdout, stderr, code := run(t, append([]string{cmd, "--database-url", "postgres://127.0.0.1:1/none"}, tc.args...)...)
			require.Equal(t, 2, code, "%s %v: %s", cmd, tc.args, stderr)
			require.Contains(t, stderr, tc.want, "%s %v", cmd, tc.args)
			require.NotContains(t, stdout+stderr, shortSecret, "%s %v shows the secret", cmd, tc.args)
		}
	}
}

// TestAPILogsItsSignInAndStatusShowsItWithoutASecret: `baton api` with an
// issuer found by discovery and an HS256 backend says at start which
// issuer, audience and key source it uses and how many keys it fetched,
// and takes both kinds of token; `baton status` shows the same, and needs
// attention once the issuer's keys cannot be fetched. Neither prints the
// secret, a token or a key.
func TestAPILogsItsSignInAndStatusShowsItWithoutASecret(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	ks := oidctest.NewKeyServer(t)
	key := ks.NewPublishedKey(t, jose.ES256)
	secret := strings.Repeat("backend-secret-", 4)
	signIn := []string{"--jwt-issuer", ks.Issuer, "--jwt-audience", "https://api.baton.test", "--jwt-allow-http",
		"--jwt-hs256-secret-file", secretFile(t, secret), "--jwt-hs256-issuer", "https://app.example/"}
	// A process of its own: `baton api` registers its metrics with the
	// process's default registry, once per process.
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(testenv.BatonBinary(t), append([]string{"--log-format", "json", "api", "--database-url", db.URL, "--nats-url", n.URL,
		"--http-addr", addr, "--cors-origins", "https://app.example"}, signIn...)...)
	api, err := proctest.Start("baton api", cmd, proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { api.Stop(10 * time.Second) })
	api.WaitLine(t, 60*time.Second, `"serving HTTP API"`)
	provider := key.Sign(t, oidctest.Claims(ks.Issuer, "user-1", "https://api.baton.test", time.Minute))
	backend := oidctest.HS256(t, []byte(secret), oidctest.Claims("https://app.example/", "user-1", "https://api.baton.test", time.Minute))
	for _, token := range []string{provider, backend} {
		code, body := call(t, "POST", "http://"+addr+"/v1/conversations", token, `{"id":"demo"}`)
		require.Equal(t, http.StatusCreated, code, "%v", body)
	}
	api.Stop(10 * time.Second)
	stderr := api.Text("stderr")
	var line map[string]any
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, `"sign-in: Baton tokens and JWTs"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.NotNil(t, line, "the start-up log says which tokens the API accepts:\n%s", stderr)
	require.Equal(t, ks.Issuer, line["issuer"])
	require.Equal(t, "https://api.baton.test", line["audience"])
	require.Equal(t, "discovery: "+ks.Server.URL+"/.well-known/openid-configuration", line["key_source"])
	require.EqualValues(t, 1, line["keys"])
	require.Equal(t, "https://app.example/", line["hs256_issuer"])
	require.Contains(t, stderr, `"origins":["https://app.example"]`)

	status := func() (map[string]any, string, string) {
		out, stderr, _ := run(t, append([]string{"status", "--json", "--database-url", db.URL, "--nats-url", n.URL}, signIn...)...)
		var rep map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &rep), "status --json: %s %s", out, stderr)
		text, _, _ := run(t, append([]string{"status", "--database-url", db.URL, "--nats-url", n.URL}, signIn...)...)
		return rep, out + stderr, text
	}
	rep, all, text := status()
	jwt := rep["sign_in"].(map[string]any)["jwt"].(map[string]any)
	require.Equal(t, ks.Issuer, jwt["issuer"])
	require.Equal(t, ks.JWKSURL, jwt["jwks_url"])
	require.EqualValues(t, 1, jwt["keys"])
	require.Equal(t, "https://app.example/", jwt["hs256_issuer"])
	require.Contains(t, text, "SIGN-IN", "status shows the sign-in table:\n%s", text)
	require.Regexp(t, `JWT\s+`+ks.Issuer+`\s+https://api.baton.test\s+1 from `+ks.JWKSURL, text)
	require.Regexp(t, `JWT HS256\s+https://app.example/\s+https://api.baton.test\s+the shared secret`, text)
	require.NotContains(t, fmt.Sprint(rep["attention"]), "JWT sign-in")

	ks.SetMode(oidctest.Down)
	rep, all2, _ := status()
	require.Contains(t, fmt.Sprint(rep["attention"]), "JWT sign-in: the keys of issuer "+ks.Issuer+" cannot be fetched",
		"keys that cannot be fetched need attention")

	pub, err := json.Marshal(key.JWK)
	require.NoError(t, err)
	var pubFields struct{ X, Y string }
	require.NoError(t, json.Unmarshal(pub, &pubFields))
	for _, output := range []string{stderr, all, all2, text} {
		for what, s := range map[string]string{"the HS256 secret": secret, "a token": provider, "a token's signature": backend[strings.LastIndex(backend, ".")+1:], "key material": pubFields.X} {
			require.NotContains(t, output, s, "an output shows %s", what)
		}
	}
}
