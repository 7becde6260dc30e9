package pgcluster_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
)

// tlsHBA admits every role with a password over TLS only; the harness
// adds its own trust lines for the superuser without TLS.
var tlsHBA = []string{
	"hostssl all         all 127.0.0.1/32 scram-sha-256",
	"hostssl replication all 127.0.0.1/32 scram-sha-256",
}

// otherCA writes a certificate authority that signed nothing the server
// holds.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "someone else"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "other-ca.crt")
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	return path
}

// withParam returns rawURL with its query parameter key set to value.
func withParam(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// requireTLS checks that conn runs over TLS, from the client's side.
func requireTLS(t *testing.T, conn *pgconn.PgConn) {
	t.Helper()
	tc, ok := conn.Conn().(*tls.Conn)
	require.True(t, ok, "the connection is a TLS connection, not %T", conn.Conn())
	require.True(t, tc.ConnectionState().HandshakeComplete)
}

func TestTLSVerifyFullWithAPasswordIncludingReplicationAndTheStandby(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := newCluster(t, pgcluster.Options{TLS: true, HBA: tlsHBA})

	ca := primary.CAFile()
	require.FileExists(t, ca)
	key, err := os.Stat(filepath.Join(primary.Dir(), "server.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), key.Mode().Perm(), "the server refuses a key that others can read")
	if uid, _, ok := pgcluster.ServerUser(); ok {
		require.EqualValues(t, uid, key.Sys().(*syscall.Stat_t).Uid, "the key belongs to the server user")
	}

	// The harness keeps its way in: the superuser, without TLS.
	admin := connect(t, ctx, primary.URL("postgres"))
	exec(t, ctx, admin, `CREATE ROLE app LOGIN REPLICATION PASSWORD 'app-secret'`)

	tlsURL := primary.TLSURL("app", "app-secret", "postgres")
	require.Contains(t, tlsURL, "sslmode=verify-full")
	c := connect(t, ctx, tlsURL)
	requireTLS(t, c.PgConn())
	var ssl bool
	require.NoError(t, c.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl))
	require.True(t, ssl, "the server sees a TLS connection")

	_, err = pgx.Connect(ctx, primary.TLSURL("app", "wrong", "postgres"))
	require.ErrorContains(t, err, "password authentication failed", "a wrong password is refused")
	_, err = pgx.Connect(ctx, withParam(t, tlsURL, "sslmode", "disable"))
	require.ErrorContains(t, err, "no pg_hba.conf entry", "app without TLS is refused")
	_, err = pgx.Connect(ctx, withParam(t, tlsURL, "sslrootcert", otherCA(t)))
	require.ErrorContains(t, err, "certificate signed by unknown authority", "a client that trusts another CA refuses the server")

	// Logical replication connections, as the relay opens them.
	repl, err := pgconn.Connect(ctx, tlsURL+"&replication=database")
	require.NoError(t, err)
	defer repl.Close(context.Background())
	requireTLS(t, repl)
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	require.NoError(t, err)
	require.Equal(t, "postgres", sys.DBName)

	// A standby keeps TLS, the CA and the pg_hba lines of its primary.
	standby := newStandby(t, primary, pgcluster.StandbyOptions{})
	s := connect(t, ctx, standby.TLSURL("app", "app-secret", "postgres"))
	requireTLS(t, s.PgConn())
	_, err = pgx.Connect(ctx, withParam(t, standby.TLSURL("app", "app-secret", "postgres"), "sslmode", "disable"))
	require.ErrorContains(t, err, "no pg_hba.conf entry")
	caPEM, err := os.ReadFile(ca)
	require.NoError(t, err)
	standbyCA, err := os.ReadFile(standby.CAFile())
	require.NoError(t, err)
	require.Equal(t, caPEM, standbyCA, "one CA for both")
}

func TestTLSSurvivesARestartWithTheSameCA(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newCluster(t, pgcluster.Options{TLS: true})
	before, err := os.ReadFile(c.CAFile())
	require.NoError(t, err)
	require.NoError(t, c.Restart(ctx, pgcluster.Fast))
	after, err := os.ReadFile(c.CAFile())
	require.NoError(t, err)
	require.Equal(t, before, after, "a client's CA file stays valid across restarts")
	// initdb's pg_hba.conf trusts the superuser over TLS too.
	conn := connect(t, ctx, c.TLSURL("postgres", "", "postgres"))
	requireTLS(t, conn.PgConn())
}
