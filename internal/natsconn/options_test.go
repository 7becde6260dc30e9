package natsconn_test

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/natsconn"
)

func TestOptionsDefaults(t *testing.T) {
	t.Parallel()
	o := natsconn.Options{}.WithDefaults()
	require.Equal(t, "nats://127.0.0.1:4222", o.URL)
	require.Equal(t, "_INBOX", o.InboxPrefix)
	require.NoError(t, o.Validate())
}

func TestOptionsValidateNamesTheSettingAndKeepsSecretsOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}

	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	seed, err := user.Seed()
	require.NoError(t, err)
	seedFile := write("user.nk", string(seed))
	account, err := nkeys.CreateAccount()
	require.NoError(t, err)
	accountSeed, err := account.Seed()
	require.NoError(t, err)
	accountSeedFile := write("account.nk", string(accountSeed))
	pub, err := user.PublicKey()
	require.NoError(t, err)
	userJWT, err := jwt.NewUserClaims(pub).Encode(account)
	require.NoError(t, err)
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	require.NoError(t, err)
	credsFile := write("user.creds", string(creds))
	jwtOnly := write("jwt-only.creds", "-----BEGIN NATS USER JWT-----\n"+userJWT+"\n------END NATS USER JWT------\n")
	seedOnlyCreds := write("seed-only.creds", string(seed))
	garbage := write("garbage", "SUsecret-but-not-a-seed\n")

	ca := newTestCA(t, "ca")
	cert, key := ca.issue(t, "client", x509.ExtKeyUsageClientAuth)
	_, otherKey := ca.issue(t, "other", x509.ExtKeyUsageClientAuth)

	for _, tc := range []struct {
		name    string
		o       natsconn.Options
		setting string
		secrets []string
	}{
		{"empty element", natsconn.Options{URL: "nats://a:4222,,nats://b:4222"}, "--nats-url / BATON_NATS_URL", nil},
		{"unparsable URL with a password", natsconn.Options{URL: "nats://u:s3cr et%@host:4222"}, "--nats-url / BATON_NATS_URL", []string{"s3cr et%"}},
		{"bad port with a token", natsconn.Options{URL: "nats://t0k3n@host:42x2"}, "--nats-url / BATON_NATS_URL", []string{"t0k3n"}},
		{"password cut by a comma", natsconn.Options{URL: "nats://u:pXa,sYs@h:4222"}, "--nats-url / BATON_NATS_URL", []string{"pXa", "sYs"}},
		{"wrong scheme", natsconn.Options{URL: "http://u:pw123@host:4222"}, "--nats-url / BATON_NATS_URL", []string{"pw123"}},
		{"creds and seed", natsconn.Options{CredsFile: credsFile, NKeySeedFile: seedFile}, "--nats-creds / BATON_NATS_CREDS and --nats-nkey-seed / BATON_NATS_NKEY_SEED", nil},
		{"password and creds", natsconn.Options{URL: "nats://u:pw456@h:4222", CredsFile: credsFile}, "--nats-creds / BATON_NATS_CREDS", []string{"pw456"}},
		{"token and seed", natsconn.Options{URL: "nats://tok789@h:4222", NKeySeedFile: seedFile}, "--nats-nkey-seed / BATON_NATS_NKEY_SEED", []string{"tok789"}},
		{"missing creds", natsconn.Options{CredsFile: filepath.Join(dir, "nope.creds")}, "--nats-creds / BATON_NATS_CREDS", nil},
		{"creds is a folder", natsconn.Options{CredsFile: dir}, "--nats-creds / BATON_NATS_CREDS", nil},
		{"creds without seed", natsconn.Options{CredsFile: jwtOnly}, "--nats-creds / BATON_NATS_CREDS", []string{userJWT}},
		{"creds without JWT", natsconn.Options{CredsFile: seedOnlyCreds}, "--nats-creds / BATON_NATS_CREDS", []string{string(seed)}},
		{"missing seed", natsconn.Options{NKeySeedFile: filepath.Join(dir, "nope.nk")}, "--nats-nkey-seed / BATON_NATS_NKEY_SEED", nil},
		{"seed file without a seed", natsconn.Options{NKeySeedFile: garbage}, "--nats-nkey-seed / BATON_NATS_NKEY_SEED", []string{"SUsecret"}},
		{"account seed for a user", natsconn.Options{NKeySeedFile: accountSeedFile}, "--nats-nkey-seed / BATON_NATS_NKEY_SEED", []string{string(accountSeed)}},
		{"missing CA", natsconn.Options{TLSCAFile: filepath.Join(dir, "nope.pem")}, "--nats-tls-ca / BATON_NATS_TLS_CA", nil},
		{"CA not PEM", natsconn.Options{TLSCAFile: seedFile}, "--nats-tls-ca / BATON_NATS_TLS_CA", []string{string(seed)}},
		{"cert without key", natsconn.Options{TLSCertFile: cert}, "--nats-tls-key / BATON_NATS_TLS_KEY", nil},
		{"key without cert", natsconn.Options{TLSKeyFile: key}, "--nats-tls-cert / BATON_NATS_TLS_CERT", nil},
		{"key of another cert", natsconn.Options{TLSCertFile: cert, TLSKeyFile: otherKey}, "--nats-tls-key / BATON_NATS_TLS_KEY", nil},
		{"key as cert", natsconn.Options{TLSCertFile: key, TLSKeyFile: key}, "--nats-tls-cert / BATON_NATS_TLS_CERT", nil},
		{"inbox prefix with a wildcard", natsconn.Options{InboxPrefix: "_INBOX_worker.>"}, "--nats-inbox-prefix / BATON_NATS_INBOX_PREFIX", nil},
		{"inbox prefix ending in a dot", natsconn.Options{InboxPrefix: "_INBOX_worker."}, "--nats-inbox-prefix / BATON_NATS_INBOX_PREFIX", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.WithDefaults().Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.setting)
			for _, s := range tc.secrets {
				require.NotContains(t, err.Error(), s, "the error must not show a secret")
			}
			// Connect refuses the same way, before any network traffic.
			_, cerr := natsconn.Connect(tc.o)
			require.EqualError(t, cerr, err.Error())
		})
	}

	// Validate on its own (without WithDefaults) asks for a server.
	err = natsconn.Options{URL: " "}.Validate()
	require.ErrorContains(t, err, "no NATS server given: set --nats-url / BATON_NATS_URL")

	// The key files themselves never show either.
	keyPEM, err := os.ReadFile(otherKey)
	require.NoError(t, err)
	err = natsconn.Options{TLSCertFile: cert, TLSKeyFile: otherKey}.Validate()
	require.NotContains(t, err.Error(), string(keyPEM[40:80]))

	// Good settings pass.
	require.NoError(t, natsconn.Options{
		URL:       "nats://n1:4222, tls://n2:4222,n3:4222",
		CredsFile: credsFile, TLSCAFile: ca.File, TLSCertFile: cert, TLSKeyFile: key, InboxPrefix: "_INBOX_worker",
	}.Validate())
	require.NoError(t, natsconn.Options{URL: "nats://u:p%2Cw@n1:4222", TLSCAFile: ca.File}.Validate())
	require.NoError(t, natsconn.Options{URL: "nats://n1:4222", NKeySeedFile: seedFile}.Validate())
}
