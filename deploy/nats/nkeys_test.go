package natsdeploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
)

func TestWriteNKeysMakesASeedPerUserAndTheirPublicKeys(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "nkeys")
	require.NoError(t, natsdeploy.WriteNKeys(dir))

	env := readEnvFile(t, filepath.Join(dir, natsdeploy.EnvFile))
	require.Len(t, env, len(natsdeploy.Users))
	seen := map[string]bool{}
	for _, u := range natsdeploy.Users {
		path := filepath.Join(dir, natsdeploy.SeedFile(u.Name))
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "%s must be readable by its owner only", path)
		seed, err := os.ReadFile(path)
		require.NoError(t, err)
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		require.True(t, nkeys.IsValidPublicUserKey(pub))
		require.Equal(t, pub, env[u.Env], "%s in %s should be the public key of %s", u.Env, natsdeploy.EnvFile, path)
		require.False(t, seen[pub], "every user gets a key of its own")
		seen[pub] = true
	}
	envText, err := os.ReadFile(filepath.Join(dir, natsdeploy.EnvFile))
	require.NoError(t, err)
	for _, u := range natsdeploy.Users {
		seed, err := os.ReadFile(filepath.Join(dir, natsdeploy.SeedFile(u.Name)))
		require.NoError(t, err)
		require.NotContains(t, string(envText), strings.TrimSpace(string(seed)), "the environment file must hold no seed")
	}

	// The accounts file uses exactly these variables.
	conf, err := os.ReadFile("accounts.conf")
	require.NoError(t, err)
	for _, u := range natsdeploy.Users {
		require.Contains(t, string(conf), "nkey: $"+u.Env)
		if u.InboxPrefix != "" {
			require.Contains(t, string(conf), `"`+u.InboxPrefix+`.>"`)
		}
	}

	// A second run would lock the components out: it refuses.
	err = natsdeploy.WriteNKeys(dir)
	require.ErrorContains(t, err, "already exists")
}

// TestEveryVariableOfTheConfigurationHasASource: each $VARIABLE the
// configuration files read is set by nats-server.env or by make-nkeys's
// nkeys.env, so a server started as the README says finds them all.
func TestEveryVariableOfTheConfigurationHasASource(t *testing.T) {
	t.Parallel()
	sources := readEnvFile(t, "nats-server.env")
	for _, u := range natsdeploy.Users {
		sources[u.Env] = "nkeys.env"
	}
	used := map[string]bool{}
	for _, f := range []string{"cluster.conf", "tls.conf", "accounts.conf", "node-1.conf", "node-2.conf", "node-3.conf"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			line, _, _ = strings.Cut(line, "#")
			line = quoted.ReplaceAllString(line, "")
			for _, m := range confVariable.FindAllStringSubmatch(line, -1) {
				require.Contains(t, sources, m[1], "%s reads $%s, which neither nats-server.env nor nkeys.env sets", f, m[1])
				used[m[1]] = true
			}
		}
	}
	for k := range sources {
		require.True(t, used[k], "%s is set but no configuration file reads it", k)
	}
}

// A variable reference of a nats-server configuration file is a $NAME
// outside quotes; a quoted "$JS.API…" is a subject.
var (
	confVariable = regexp.MustCompile(`\$([A-Za-z_][A-Za-z0-9_]*)`)
	quoted       = regexp.MustCompile(`"[^"]*"`)
)
