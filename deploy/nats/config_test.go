package natsdeploy_test

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
)

// TestShippedNodeFilesSecureTheCluster reads the node files as nats-server
// does and checks the production values the cluster test replaces to run
// three nodes on one machine (addresses, ports, routes, store), and those
// it keeps: monitoring on the loopback interface only, TLS on clients and
// routes, nkey users only, each limited to its own inbox.
func TestShippedNodeFilesSecureTheCluster(t *testing.T) {
	t.Parallel()
	env := nodeEnv(t)

	for i, node := range nodes {
		o := parseConfig(t, node, env)
		require.Equal(t, fmt.Sprintf("n%d", i+1), o.ServerName)
		require.Equal(t, "0.0.0.0", o.Host)
		require.Equal(t, 4222, o.Port)
		require.Equal(t, "127.0.0.1", o.HTTPHost, "monitoring must answer on the loopback interface only")
		require.Equal(t, 8222, o.HTTPPort)
		require.Zero(t, o.HTTPSPort)
		require.NotNil(t, o.TLSConfig, "clients must use TLS")
		require.True(t, o.JetStream)
		require.Equal(t, "/var/lib/nats", o.StoreDir)
		require.Equal(t, "baton", o.Cluster.Name)
		require.Equal(t, 6222, o.Cluster.Port)
		require.NotNil(t, o.Cluster.TLSConfig, "routes must use TLS")
		require.Equal(t, tls.RequireAndVerifyClientCert, o.Cluster.TLSConfig.ClientAuth, "a node must show a certificate of the cluster's CA to join")
		var routes []string
		for _, r := range o.Routes {
			routes = append(routes, r.String())
		}
		require.Equal(t, []string{"nats-route://n1.internal:6222", "nats-route://n2.internal:6222", "nats-route://n3.internal:6222"}, routes)
		require.Empty(t, o.NoAuthUser, "no client may connect without credentials")
		require.Empty(t, o.Users, "users authenticate with nkeys, not passwords")
		require.Equal(t, "SYS", o.SystemAccount)
		require.Len(t, o.Nkeys, len(natsdeploy.Users))
		for _, u := range o.Nkeys {
			if u.Account.Name == "SYS" {
				continue
			}
			require.Equal(t, "BATON", u.Account.Name)
			require.NotNil(t, u.Permissions, "every Baton user has a permission list")
			require.Equal(t, []string{inboxOf(t, env, u.Nkey) + ".>"}, onlyInboxes(u.Permissions.Subscribe.Allow),
				"a user may subscribe to its own inbox prefix and no other")
		}
	}
}

// TestNodeRefusesToStartWithoutAUsersKey: a node whose environment lacks
// a public key does not start with a user less; it names the variable.
func TestNodeRefusesToStartWithoutAUsersKey(t *testing.T) {
	t.Parallel()
	env := nodeEnv(t)
	delete(env, "BATON_NATS_NKEY_WORKER")

	_, err := processConfigFile("node-1.conf", env)
	require.ErrorContains(t, err, "BATON_NATS_NKEY_WORKER")
}

// inboxOf returns the inbox prefix of the user whose public key is pub.
func inboxOf(t *testing.T, env map[string]string, pub string) string {
	t.Helper()
	for _, u := range natsdeploy.Users {
		if env[u.Env] == pub {
			return u.InboxPrefix
		}
	}
	t.Fatalf("public key %s belongs to no user of natsdeploy.Users", pub)
	return ""
}

func onlyInboxes(subjects []string) []string {
	var out []string
	for _, s := range subjects {
		if strings.HasPrefix(s, "_INBOX") {
			out = append(out, s)
		}
	}
	return out
}

// nodeEnv returns a complete environment for a node: the public keys of a
// fresh set of users, node n1's certificate and the shipped store folder.
func nodeEnv(t *testing.T) map[string]string {
	t.Helper()
	certs := t.TempDir()
	makeCerts(t, certs, "n1")
	keys := filepath.Join(t.TempDir(), "nkeys")
	require.NoError(t, natsdeploy.WriteNKeys(keys))
	env := readEnvFile(t, filepath.Join(keys, natsdeploy.EnvFile))
	env["BATON_NATS_SERVER_CERT"] = filepath.Join(certs, "n1.pem")
	env["BATON_NATS_SERVER_KEY"] = filepath.Join(certs, "n1-key.pem")
	env["BATON_NATS_SERVER_CA"] = filepath.Join(certs, "ca.pem")
	env["BATON_NATS_STORE_DIR"] = readEnvFile(t, "nats-server.env")["BATON_NATS_STORE_DIR"]
	return env
}
