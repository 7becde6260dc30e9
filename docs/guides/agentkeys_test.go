package guides_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
)

// jsBlock returns the one ```js block of a Markdown page.
func jsBlock(t *testing.T, page string) string {
	t.Helper()
	f, err := os.Open(page)
	require.NoError(t, err)
	defer f.Close()
	var (
		lines  []string
		in     bool
		blocks int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		switch line := sc.Text(); {
		case line == "```js":
			in = true
			blocks++
		case in && line == "```":
			in = false
		case in:
			lines = append(lines, line)
		}
	}
	require.NoError(t, sc.Err())
	require.Equal(t, 1, blocks, "%s has one js block", page)
	return strings.Join(lines, "\n") + "\n"
}

// TestTheAgentKeysGuidesVerifierAcceptsBatonsTokensOnly runs the Node
// verifier of docs/guides/agent-keys.md, as written, with the jose
// package, against the JWKS a real API serves: a token of the worker's
// key gives its user, conversation, turn and step; a token for another
// audience, of another issuer or key, a changed one and a missing one
// are refused.
func TestTheAgentKeysGuidesVerifierAcceptsBatonsTokensOnly(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is needed: make test-deps installs it")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// jose comes with the OpenID Connect provider that the sign-in tests
	// run, which make test-deps installs from its lockfile.
	modules := filepath.Join(root, "internal", "oidctest", "provider", "node_modules")
	require.DirExists(t, filepath.Join(modules, "jose"), "run make test-deps")

	dir := t.TempDir()
	key, err := jwtauth.CreateKeyPair(filepath.Join(dir, "agent.key"), filepath.Join(dir, "agent.pub"), false)
	require.NoError(t, err)
	stranger, err := jwtauth.CreateKeyPair(filepath.Join(dir, "stranger.key"), filepath.Join(dir, "stranger.pub"), false)
	require.NoError(t, err)
	keys, err := jwtauth.LoadPublicKeys(filepath.Join(dir, "agent.pub"))
	require.NoError(t, err)
	s, err := api.New(api.Config{AgentKeys: keys}, testenv.Database(t).Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)

	const audience = "https://agent.example/step"
	claims := func(change func(*jwtauth.StepClaims)) jwtauth.StepClaims {
		c := jwtauth.StepClaims{Audience: audience, Subject: "https://app.example/|user-7",
			Conversation: "c_0123", Turn: "t_4567", Step: "step_89ab", Expiry: time.Now().Add(time.Minute)}
		if change != nil {
			change(&c)
		}
		return c
	}
	sign := func(k *jwtauth.SigningKey, c jwtauth.StepClaims) string {
		tok, err := k.Sign(c)
		require.NoError(t, err)
		return tok
	}
	good := sign(key, claims(nil))
	parts := strings.Split(good, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	changed := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), "user-7", "user-8", 1))) + "." + parts[2]
	headers := map[string]string{
		"good":           "Bearer " + good,
		"other audience": "Bearer " + sign(key, claims(func(c *jwtauth.StepClaims) { c.Audience = "https://other-agent.example" })),
		"other issuer":   "Bearer " + sign(key, claims(func(c *jwtauth.StepClaims) { c.Issuer = "someone-else" })),
		"other key":      "Bearer " + sign(stranger, claims(nil)),
		"changed claims": "Bearer " + changed,
		"no token":       "",
		"basic":          "Basic " + base64.StdEncoding.EncodeToString([]byte("baton:"+good)),
	}

	require.NoError(t, os.WriteFile(filepath.Join(dir, "verify-baton.mjs"), []byte(jsBlock(t, "agent-keys.md")), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.mjs"), []byte(`import { verifyBaton } from "./verify-baton.mjs";
const headers = JSON.parse(process.argv[2]);
const out = {};
for (const [name, header] of Object.entries(headers)) {
  try {
    out[name] = { ok: await verifyBaton(header) };
  } catch (e) {
    out[name] = { error: e.code ?? e.message };
  }
}
console.log(JSON.stringify(out));
`), 0o644))
	require.NoError(t, os.Symlink(modules, filepath.Join(dir, "node_modules")))
	arg, err := json.Marshal(headers)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "main.mjs", string(arg))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BATON_API="+hs.URL, "AGENT_AUDIENCE="+audience)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	var results map[string]struct {
		OK    map[string]string `json:"ok"`
		Error string            `json:"error"`
	}
	require.NoError(t, json.Unmarshal(out, &results), "%s", out)
	require.Equal(t, map[string]string{"user": "https://app.example/|user-7", "conversation": "c_0123", "turn": "t_4567", "step": "step_89ab"},
		results["good"].OK, "the guide's verifier accepts the worker's token: %s", out)
	for name := range headers {
		if name == "good" {
			continue
		}
		require.Nil(t, results[name].OK, "the guide's verifier must refuse a token with %s: %s", name, out)
		require.NotEmpty(t, results[name].Error, "%s: %s", name, out)
	}
	t.Logf("refused: %s", out)
}
