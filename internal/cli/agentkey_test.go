package cli_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/secretscan"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
)

// privateKeySecrets are the forms in which the private key in path could
// be shown: its seed in base64, base64url and hex, and its PEM body.
func privateKeySecrets(t *testing.T, path string) []secretscan.Secret {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	block, _ := pem.Decode(b)
	require.NotNil(t, block, "%s is PEM", path)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	seed := key.(ed25519.PrivateKey).Seed()
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	return []secretscan.Secret{
		{Name: "private key seed, base64", Value: base64.StdEncoding.EncodeToString(seed)},
		{Name: "private key seed, base64url", Value: base64.RawURLEncoding.EncodeToString(seed)},
		{Name: "private key seed, hex", Value: hex.EncodeToString(seed)},
		{Name: "private key PEM body", Value: body[len(body)-44:]},
	}
}

// unreachableDatabase is a database URL that nothing answers: commands
// that fail before they connect never notice.
const unreachableDatabase = "postgres://baton@127.0.0.1:1/baton"

func requireNoKey(t *testing.T, secrets []secretscan.Secret, outputs ...string) {
	t.Helper()
	for _, out := range outputs {
		for _, s := range secrets {
			require.Empty(t, s.In(out), "the output shows the %s:\n%s", s.Name, s.Mask(out))
		}
	}
}

// TestAgentKeyCreateWritesAPairTheAPIServesAndNeverPrintsTheKey: `baton
// agent-key create` writes the private key with mode 0600 and prints its
// key id and where the files are, never the key; it refuses to replace a
// file without --force; `baton api --agent-public-key` serves the public
// keys of a rotation at /.well-known/jwks.json, and a private key given
// there that others may read is a usage error that shows no key.
func TestAgentKeyCreateWritesAPairTheAPIServesAndNeverPrintsTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "agent.key"), filepath.Join(dir, "agent.pub")
	out, stderr, code := run(t, "agent-key", "create", "--private-key", priv, "--public-key", pub)
	require.Equal(t, 0, code, stderr)
	key, err := jwtauth.LoadSigningKey(priv)
	require.NoError(t, err)
	require.Contains(t, out, "key id "+key.KeyID())
	require.Contains(t, out, priv)
	require.Contains(t, out, pub)
	require.Contains(t, out, "--agent-signing-key")
	require.Contains(t, out, "--agent-public-key")
	fi, err := os.Stat(priv)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the private key is its owner's only")
	secrets := privateKeySecrets(t, priv)
	requireNoKey(t, secrets, out, stderr)

	before, err := os.ReadFile(priv)
	require.NoError(t, err)
	out, stderr, code = run(t, "agent-key", "create", "--private-key", priv, "--public-key", pub)
	require.Equal(t, 1, code, "an existing key pair is kept: %s", stderr)
	require.Contains(t, stderr, priv+" exists already")
	require.Contains(t, stderr, "--force")
	requireNoKey(t, secrets, out, stderr)
	after, err := os.ReadFile(priv)
	require.NoError(t, err)
	require.Equal(t, before, after, "the private key is unchanged")

	_, stderr, code = run(t, "agent-key", "create", "--private-key", filepath.Join(dir, "other.key"))
	require.Equal(t, 2, code, "--public-key is required: %s", stderr)
	require.Contains(t, stderr, "--public-key")

	// A rotation: the old public key, and the new pair made with --force
	// over other files.
	oldPub := filepath.Join(dir, "old.pub")
	require.NoError(t, os.Rename(pub, oldPub))
	out, stderr, code = run(t, "agent-key", "create", "--private-key", priv, "--public-key", pub, "--force")
	require.Equal(t, 0, code, stderr)
	newKey, err := jwtauth.LoadSigningKey(priv)
	require.NoError(t, err)
	require.NotEqual(t, key.KeyID(), newKey.KeyID())
	require.Contains(t, out, "key id "+newKey.KeyID())
	newSecrets := privateKeySecrets(t, priv)
	requireNoKey(t, append(secrets, newSecrets...), out, stderr)

	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	stop := start(t, "api", "--database-url", db.URL, "--nats-url", n.URL, "--http-addr", apiAddr,
		"--agent-public-key", oldPub, "--agent-public-key", pub)
	waitHTTP(t, "http://"+apiAddr+"/healthz")
	resp, err := http.Get("http://" + apiAddr + "/.well-known/jwks.json")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var jwks struct {
		Keys []struct {
			Kid, Kty, Crv, Alg, Use string
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(body, &jwks))
	var kids []string
	for _, k := range jwks.Keys {
		require.Equal(t, "OKP", k.Kty)
		require.Equal(t, "Ed25519", k.Crv)
		require.Equal(t, "EdDSA", k.Alg)
		require.Equal(t, "sig", k.Use)
		kids = append(kids, k.Kid)
	}
	require.Equal(t, []string{key.KeyID(), newKey.KeyID()}, kids)
	code, stderr = stop()
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "serving the agent keys at /.well-known/jwks.json")
	require.Contains(t, stderr, newKey.KeyID())
	requireNoKey(t, append(secrets, newSecrets...), stderr)

	// A private key that every user may read is refused before anything
	// starts, naming the flag and the file.
	require.NoError(t, os.Chmod(priv, 0o644))
	out, stderr, code = run(t, "api", "--database-url", unreachableDatabase, "--agent-public-key", priv)
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--agent-public-key / BATON_AGENT_PUBLIC_KEY: "+priv)
	require.Contains(t, stderr, "chmod 600")
	requireNoKey(t, newSecrets, out, stderr)
}

// TestAgentPublicKeyVariableTakesCommaSeparatedFiles: the variable names
// several files, each loaded (the second one is missing, and said so).
func TestAgentPublicKeyVariableTakesCommaSeparatedFiles(t *testing.T) {
	// Not parallel: it sets a process environment variable.
	dir := t.TempDir()
	pub := filepath.Join(dir, "agent.pub")
	_, err := jwtauth.CreateKeyPair(filepath.Join(dir, "agent.key"), pub, false)
	require.NoError(t, err)
	missing := filepath.Join(dir, "missing.pub")
	t.Setenv("BATON_AGENT_PUBLIC_KEY", pub+","+missing)
	_, stderr, code := run(t, "api", "--database-url", unreachableDatabase)
	require.Equal(t, 2, code, "the key files are checked before anything connects: %s", stderr)
	require.Contains(t, stderr, "--agent-public-key / BATON_AGENT_PUBLIC_KEY: "+missing+" does not exist")
}
