package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// NATSServer starts a NATS server in this process on a random port of
// 127.0.0.1, set up by configure (a login, TLS, JetStream), and returns
// its host:port. It stops when t ends. Unlike StartNATS, it hands the
// test the server's own options: for tests of how a client logs in.
func NATSServer(t testing.TB, configure func(*server.Options)) string {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	configure(o)
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("testenv: NATS server: %v", err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatal("testenv: the NATS server did not accept clients within 20s")
	}
	return s.Addr().String()
}

// NKeyUser makes a NATS nkey user and returns its public key, for a
// server's Nkeys, and its seed, for the client.
func NKeyUser(t testing.TB) (pub string, seed []byte) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	if seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	return pub, seed
}

// NATSOperator is a NATS operator for a server in operator (JWT) mode:
// it issued a system account, SYS, and an account, BATON, with JetStream
// enabled, both in a memory resolver.
type NATSOperator struct {
	claims   *jwt.OperatorClaims
	resolver *server.MemAccResolver
	sys      string
	// account is BATON's key pair, which signs its users.
	account nkeys.KeyPair
}

// NewNATSOperator makes an operator, its accounts and their resolver.
func NewNATSOperator(t testing.TB) *NATSOperator {
	t.Helper()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("testenv: NATS operator: %v", err)
		}
	}
	operator, err := nkeys.CreateOperator()
	check(err)
	operatorPub, err := operator.PublicKey()
	check(err)
	op := &NATSOperator{claims: jwt.NewOperatorClaims(operatorPub), resolver: &server.MemAccResolver{}}
	op.claims.Name = "baton-test"
	newAccount := func(name string, jetStream bool) (nkeys.KeyPair, string) {
		t.Helper()
		kp, err := nkeys.CreateAccount()
		check(err)
		pub, err := kp.PublicKey()
		check(err)
		claims := jwt.NewAccountClaims(pub)
		claims.Name = name
		if jetStream {
			claims.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		token, err := claims.Encode(operator)
		check(err)
		check(op.resolver.Store(pub, token))
		return kp, pub
	}
	_, op.sys = newAccount("SYS", false)
	op.account, _ = newAccount("BATON", true)
	op.claims.SystemAccount = op.sys
	_, err = op.claims.Encode(operator)
	check(err)
	return op
}

// Configure makes o a server that trusts the operator and knows its
// accounts; for NATSServer's configure.
func (op *NATSOperator) Configure(o *server.Options) {
	o.TrustedOperators = []*jwt.OperatorClaims{op.claims}
	o.AccountResolver = op.resolver
	o.SystemAccount = op.sys
}

// NATSCreds is a user of an operator's account and its .creds file.
type NATSCreds struct {
	// File is the .creds file, in a folder of the test's.
	File string
	// JWT and Seed are the user's, as the file holds them.
	JWT  string
	Seed []byte
	// Claims are the user's claims, which JWT encodes signed by the
	// account.
	Claims *jwt.UserClaims
}

// User makes a user name of the operator's account BATON and writes its
// .creds file, <name>.creds.
func (op *NATSOperator) User(t testing.TB, name string) NATSCreds {
	t.Helper()
	pub, seed := NKeyUser(t)
	claims := jwt.NewUserClaims(pub)
	claims.Name = name
	userJWT, err := claims.Encode(op.account)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(file, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return NATSCreds{File: file, JWT: userJWT, Seed: seed, Claims: claims}
}
