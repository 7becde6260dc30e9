package natsconn_test

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/natsconn"
	"github.com/batonhq/baton/internal/testenv"
)

// roundTrip proves the connection works: a message published on it comes
// back to a subscription on it.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.SubscribeSync("natsconn.test")
	require.NoError(t, err)
	require.NoError(t, nc.Publish("natsconn.test", []byte("ping")))
	m, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err, "the message published on the connection should come back")
	require.Equal(t, "ping", string(m.Data))
}

func TestConnectWithUserAndPasswordInTheURL(t *testing.T) {
	t.Parallel()
	addr := testenv.NATSServer(t, func(o *server.Options) { o.Username, o.Password = "baton", "pa55-word" })

	nc, err := natsconn.Connect(natsconn.Options{URL: "nats://baton:pa55-word@" + addr, Name: "natsconn test"})
	require.NoError(t, err)
	defer nc.Close()
	roundTrip(t, nc)
}

func TestConnectWithATokenInTheURL(t *testing.T) {
	t.Parallel()
	addr := testenv.NATSServer(t, func(o *server.Options) { o.Authorization = "t0ken-s3cret" })

	nc, err := natsconn.Connect(natsconn.Options{URL: "nats://t0ken-s3cret@" + addr})
	require.NoError(t, err)
	defer nc.Close()
	roundTrip(t, nc)

	_, err = natsconn.Connect(natsconn.Options{URL: "nats://wr0ng-token@" + addr})
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), "wr0ng-token")
}

func TestConnectWithAnNKeySeedFile(t *testing.T) {
	t.Parallel()
	pub, seed := testenv.NKeyUser(t)
	seedFile := filepath.Join(t.TempDir(), "worker.nk")
	require.NoError(t, os.WriteFile(seedFile, seed, 0o600))
	addr := testenv.NATSServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })

	nc, err := natsconn.Connect(natsconn.Options{URL: "nats://" + addr, NKeySeedFile: seedFile})
	require.NoError(t, err)
	defer nc.Close()
	roundTrip(t, nc)

	// A seed the server does not list is refused.
	_, otherSeed := testenv.NKeyUser(t)
	otherFile := filepath.Join(t.TempDir(), "other.nk")
	require.NoError(t, os.WriteFile(otherFile, otherSeed, 0o600))
	_, err = natsconn.Connect(natsconn.Options{URL: "nats://" + addr, NKeySeedFile: otherFile})
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), string(otherSeed))
}

func TestConnectWithACredsFileToAServerInOperatorMode(t *testing.T) {
	t.Parallel()
	operator := testenv.NewNATSOperator(t)
	user := operator.User(t, "worker")
	addr := testenv.NATSServer(t, operator.Configure)

	nc, err := natsconn.Connect(natsconn.Options{URL: "nats://" + addr, CredsFile: user.File})
	require.NoError(t, err)
	defer nc.Close()
	roundTrip(t, nc)

	// Without the creds the same server refuses.
	_, err = natsconn.Connect(natsconn.Options{URL: "nats://" + addr})
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// A user signed by an account the operator never issued is refused.
	rogue, err := nkeys.CreateAccount()
	require.NoError(t, err)
	rogueJWT, err := user.Claims.Encode(rogue)
	require.NoError(t, err)
	rogueCreds, err := jwt.FormatUserConfig(rogueJWT, user.Seed)
	require.NoError(t, err)
	rogueFile := filepath.Join(t.TempDir(), "rogue.creds")
	require.NoError(t, os.WriteFile(rogueFile, rogueCreds, 0o600))
	_, err = natsconn.Connect(natsconn.Options{URL: "nats://" + addr, CredsFile: rogueFile})
	require.Error(t, err, "a user JWT from an unknown account must be refused")
	require.NotContains(t, err.Error(), string(user.Seed))
	require.NotContains(t, err.Error(), rogueJWT)
}

// tlsServer starts a server whose client port requires TLS with a
// certificate of ca; with verify, it also requires a client certificate
// of ca.
func tlsServer(t *testing.T, ca *testCA, verify bool) string {
	t.Helper()
	cert, key := ca.issue(t, "server", x509.ExtKeyUsageServerAuth)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: ca.File, Verify: verify, Timeout: 2})
	require.NoError(t, err)
	return testenv.NATSServer(t, func(o *server.Options) {
		o.TLSConfig = tc
		o.TLSVerify = verify
		o.TLSTimeout = 2
	})
}

func TestConnectOverTLSWithTheCA(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "ca")
	addr := tlsServer(t, ca, false)

	nc, err := natsconn.Connect(natsconn.Options{URL: "nats://" + addr, TLSCAFile: ca.File})
	require.NoError(t, err)
	defer nc.Close()
	state, err := nc.TLSConnectionState()
	require.NoError(t, err, "the connection should be TLS")
	require.True(t, state.HandshakeComplete)
	roundTrip(t, nc)
}

func TestConnectWithoutTheCAIsRefused(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "ca")
	addr := tlsServer(t, ca, false)

	// No CA: the system's authorities do not know the test CA.
	_, err := natsconn.Connect(natsconn.Options{URL: "nats://" + addr})
	require.Error(t, err, "a client that does not trust the server's CA must not connect")
	require.Contains(t, err.Error(), "--nats-tls-ca / BATON_NATS_TLS_CA")

	// Another CA.
	other := newTestCA(t, "other-ca")
	_, err = natsconn.Connect(natsconn.Options{URL: "nats://" + addr, TLSCAFile: other.File})
	require.Error(t, err, "a client that trusts another CA must not connect")
	var unknown x509.UnknownAuthorityError
	require.False(t, errors.As(err, &unknown), "the error must not hand out its cause")
}

func TestConnectWithMutualTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "ca")
	addr := tlsServer(t, ca, true)
	cert, key := ca.issue(t, "client", x509.ExtKeyUsageClientAuth)

	nc, err := natsconn.Connect(natsconn.Options{URL: "tls://" + addr, TLSCAFile: ca.File, TLSCertFile: cert, TLSKeyFile: key})
	require.NoError(t, err)
	defer nc.Close()
	roundTrip(t, nc)

	// Without a client certificate the server ends the handshake.
	_, err = natsconn.Connect(natsconn.Options{URL: "tls://" + addr, TLSCAFile: ca.File}, nats.MaxReconnects(0))
	require.Error(t, err, "a client without a certificate must not connect to a server that verifies clients")

	// A client certificate of another CA is refused too.
	other := newTestCA(t, "other-ca")
	otherCert, otherKey := other.issue(t, "client", x509.ExtKeyUsageClientAuth)
	_, err = natsconn.Connect(natsconn.Options{URL: "tls://" + addr, TLSCAFile: ca.File, TLSCertFile: otherCert, TLSKeyFile: otherKey})
	require.Error(t, err, "a client certificate of another CA must be refused")
}

func TestConnectWithoutCredentialsIsRefused(t *testing.T) {
	t.Parallel()
	addr := testenv.NATSServer(t, func(o *server.Options) { o.Username, o.Password = "baton", "pa55-word" })

	_, err := natsconn.Connect(natsconn.Options{URL: "nats://" + addr})
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.Contains(t, strings.ToLower(err.Error()), "authorization violation")
	require.Contains(t, err.Error(), "this process gave none: set --nats-nkey-seed / BATON_NATS_NKEY_SEED", "the error should say that credentials are missing, and where they go")
}

// TestExplainScrubsAReconnectErrorAndSaysWhatToCheck: what a client that
// retries in the background reports is shown like Connect's own errors.
func TestExplainScrubsAReconnectErrorAndSaysWhatToCheck(t *testing.T) {
	t.Parallel()
	o := natsconn.Options{URL: "nats://baton:s3cret-pa55@n1.internal:4222"}
	err := natsconn.Explain(o, fmt.Errorf("dial nats://baton:s3cret-pa55@n1.internal:4222: %w", nats.ErrAuthorization))
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), "s3cret-pa55")
	require.Contains(t, err.Error(), "connect to NATS at nats://redacted@n1.internal:4222")
	require.Contains(t, err.Error(), "the server refused these credentials")
	require.Same(t, err, natsconn.Explain(o, err), "an explained error is returned as it is")
	require.NoError(t, natsconn.Explain(o, nil))
}

func TestConnectWithAWrongPasswordIsRefusedAndTheErrorHoldsNoPassword(t *testing.T) {
	t.Parallel()
	addr := testenv.NATSServer(t, func(o *server.Options) { o.Username, o.Password = "baton", "pa55-word" })

	for _, pass := range []string{"wr0ng-pa55", "wr%40ng%2Cpa55"} {
		u := "nats://baton:" + pass + "@" + addr
		_, err := natsconn.Connect(natsconn.Options{URL: u})
		require.ErrorIs(t, err, nats.ErrAuthorization)
		require.NotContains(t, err.Error(), pass)
		require.NotContains(t, err.Error(), "wr@ng,pa55")
		require.Contains(t, err.Error(), "nats://redacted@"+addr, "the error should show which server refused")
	}
}

func TestConnectErrorRedactsEveryURL(t *testing.T) {
	t.Parallel()
	// Two ports nobody listens on.
	var addrs []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	list := fmt.Sprintf("nats://a:first-secret@%s, nats://second-token@%s", addrs[0], addrs[1])
	_, err := natsconn.Connect(natsconn.Options{URL: list}, nats.Timeout(time.Second))
	require.ErrorIs(t, err, nats.ErrNoServers)
	for _, secret := range []string{"first-secret", "second-token", "a:first"} {
		require.NotContains(t, err.Error(), secret)
	}
	require.Contains(t, err.Error(), "nats://redacted@"+addrs[0])
	require.Contains(t, err.Error(), "nats://redacted@"+addrs[1])
}

// TestInboxPrefixKeepsRepliesPrivate: a user allowed to subscribe to its
// own inbox prefix only gets replies with the prefix set, and is refused a
// subscription to the default inbox without it.
func TestInboxPrefixKeepsRepliesPrivate(t *testing.T) {
	t.Parallel()
	addr := testenv.NATSServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "worker", Password: "w", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"svc.time"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_worker.>"}},
			}},
			{Username: "svc", Password: "s"},
		}
	})
	svc, err := natsconn.Connect(natsconn.Options{URL: "nats://svc:s@" + addr})
	require.NoError(t, err)
	defer svc.Close()
	_, err = svc.Subscribe("svc.time", func(m *nats.Msg) { _ = m.Respond([]byte("now")) })
	require.NoError(t, err)
	require.NoError(t, svc.Flush())

	worker, err := natsconn.Connect(natsconn.Options{URL: "nats://worker:w@" + addr, InboxPrefix: "_INBOX_worker"})
	require.NoError(t, err)
	defer worker.Close()
	reply, err := worker.Request("svc.time", nil, 5*time.Second)
	require.NoError(t, err, "a request should get its reply through the private inbox")
	require.Equal(t, "now", string(reply.Data))
	require.True(t, strings.HasPrefix(worker.NewInbox(), "_INBOX_worker."), "inboxes should carry the prefix")

	violations := make(chan error, 4)
	plain, err := natsconn.Connect(natsconn.Options{URL: "nats://worker:w@" + addr},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.SubscribeSync(plain.NewInbox())
	require.NoError(t, err)
	select {
	case err := <-violations:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
	case <-time.After(10 * time.Second):
		t.Fatal("subscribing to the default inbox should be refused for a user limited to _INBOX_worker")
	}
}
