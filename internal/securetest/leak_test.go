package securetest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/oidctest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
)

// TestNoSecretReachesAnyOutput runs Baton's processes with every kind of
// secret they take, at debug level, the way they succeed and the ways they
// fail, and searches every byte they print for every secret, also
// percent-encoded and JSON-escaped.
//
// The secrets: a NATS password in the URL, a .creds file (its JWT and
// seed) for a server in operator mode, an nkey seed, the password of a
// PostgreSQL role that the server checks (scram-sha-256, over TLS), and
// the private key that signs requests to agents (made by `baton agent-key
// create`, given to the API, which serves its public half). With each
// NATS login, relay, worker and api run a turn through the API, then
// status, status --json and replay --dry-run run. The failing runs use a
// wrong NATS password, a wrong database password, a NATS server that is
// not there and an agent key that every user may read.
func TestNoSecretReachesAnyOutput(t *testing.T) {
	t.Parallel()
	step := timeline(t)
	testenv.StartPlainBatonBuild()

	dbPassword := "pg:" + randomText(t) + "@/#?&%"
	pg := startPostgres(t, "baton", dbPassword, "baton_password", "baton_creds", "baton_nkey", "baton_failing")
	dbURL := func(db string) string { return pg.TLSURL("baton", dbPassword, db) }

	natsPassword := "nats:" + randomText(t) + "@/%"
	passwordAddr := startNATS(t, func(o *server.Options) { o.Username, o.Password = "baton", natsPassword })
	natsURL := func(password, addr string) string {
		return (&url.URL{Scheme: "nats", User: url.UserPassword("baton", password), Host: addr}).String()
	}
	creds := startOperatorNATS(t)
	nkeySeedFile, nkeyAddr := startNKeyNATS(t)
	// Sign-in with JWTs: an issuer whose keys the API fetches (by
	// discovery) and a backend's HS256 secret in a file.
	issuer := oidctest.NewKeyServer(t)
	issuerKey := issuer.NewPublishedKey(t, jose.RS256)
	hs256Secret := "hs256:" + randomText(t) + randomText(t) + "@/%"
	hs256File := filepath.Join(t.TempDir(), "hs256.secret")
	require.NoError(t, os.WriteFile(hs256File, []byte(hs256Secret+"\n"), 0o600))
	const audience, backend = "https://api.baton.test", "https://app.example/"
	signIn := []string{"BATON_JWT_ISSUER=" + issuer.Issuer, "BATON_JWT_AUDIENCE=" + audience, "BATON_JWT_ALLOW_HTTP=true",
		"BATON_JWT_HS256_SECRET_FILE=" + hs256File, "BATON_JWT_HS256_ISSUER=" + backend}
	var jwts []string
	for _, mode := range []string{"password", "creds", "nkey"} {
		jwts = append(jwts,
			issuerKey.Sign(t, oidctest.Claims(issuer.Issuer, "user-"+mode, audience, 10*time.Minute)),
			oidctest.HS256(t, []byte(hs256Secret), oidctest.Claims(backend, "user-"+mode, audience, 10*time.Minute)))
	}
	step("PostgreSQL and the NATS servers run")
	ps := newProcesses(t)
	step("the binary is ready")

	keyDir := t.TempDir()
	agentKey := filepath.Join(keyDir, "agent-signing-key.pem")
	create, code := ps.run(t, "agent-key create", 30*time.Second, nil,
		"agent-key", "create", "--private-key", agentKey, "--public-key", filepath.Join(keyDir, "agent-public-key.pem"))
	require.Zero(t, code, "baton agent-key create failed:\n%s", create.Tail(10))
	signIn = append(signIn, "BATON_AGENT_PUBLIC_KEY="+agentKey)

	secrets := []secret{
		{Name: "NATS password", Value: natsPassword},
		{Name: "database password", Value: dbPassword},
		{Name: "JWT of the .creds file", Value: creds.jwt},
		{Name: "signature of the .creds file's JWT", Value: creds.jwt[strings.LastIndex(creds.jwt, ".")+1:]},
		{Name: "seed of the .creds file", Value: creds.seed},
		fileSecret(t, "nkey seed", nkeySeedFile),
		{Name: "HS256 secret", Value: hs256Secret},
		{Name: "modulus of the issuer's public key", Value: issuerKeyModulus(t, issuerKey)},
	}
	secrets = append(secrets, agentKeySecrets(t, agentKey)...)
	for i, tok := range jwts {
		secrets = append(secrets,
			secret{Name: fmt.Sprintf("JWT %d", i), Value: tok},
			secret{Name: fmt.Sprintf("signature of JWT %d", i), Value: tok[strings.LastIndex(tok, ".")+1:]})
	}
	var (
		tokensMu sync.Mutex
		tokens   []*process
	)

	logs := []string{"BATON_LOG_FORMAT=json", "BATON_LOG_LEVEL=debug"}
	t.Run("working", func(t *testing.T) {
		for i, mode := range []struct {
			name, db string
			nats     []string
		}{
			{"password in the URL", "baton_password", []string{"BATON_NATS_URL=" + natsURL(natsPassword, passwordAddr)}},
			{"creds file", "baton_creds", []string{"BATON_NATS_URL=nats://" + creds.addr, "BATON_NATS_CREDS=" + creds.file}},
			{"nkey seed", "baton_nkey", []string{"BATON_NATS_URL=nats://" + nkeyAddr, "BATON_NATS_NKEY_SEED=" + nkeySeedFile}},
		} {
			providerJWT, backendJWT := jwts[2*i], jwts[2*i+1]
			db := []string{"BATON_DATABASE_URL=" + dbURL(mode.db)}
			// Slots belong to the PostgreSQL cluster, not to a database:
			// each relay gets its own.
			env := append(append(append([]string{"BATON_SLOT=" + mode.db}, db...), mode.nats...), logs...)
			t.Run(mode.name, func(t *testing.T) {
				t.Parallel()
				name := func(cmd string) string { return mode.name + ": " + cmd }
				migrate, code := ps.run(t, name("migrate"), 30*time.Second, append(db, logs...), "migrate")
				require.Zero(t, code, "baton migrate failed:\n%s", migrate.Tail(10))
				token, code := ps.run(t, name("token create"), 30*time.Second, append(db, logs...), "token", "create", "--user", "alice")
				require.Zero(t, code, "baton token create failed:\n%s", token.Tail(10))
				tokensMu.Lock()
				tokens = append(tokens, token)
				tokensMu.Unlock()
				lines := strings.Split(strings.TrimSpace(token.Text("stdout")), "\n")

				ps.start(t, name("relay"), env, "relay")
				ps.start(t, name("worker"), env, "worker")
				api := ps.start(t, name("api"), append(append(env, signIn...), "BATON_HTTP_ADDR=127.0.0.1:0", "BATON_CORS_ORIGINS=https://app.example"), "api")
				var served struct{ Addr string }
				require.NoError(t, json.Unmarshal([]byte(api.WaitLine(t, 30*time.Second, `"serving HTTP API"`)), &served))
				newAPIClient(served.Addr, lines[len(lines)-1]).converse(t, "leak", "hello", 45*time.Second)
				newAPIClient(served.Addr, providerJWT).converse(t, "leak", "hello", 45*time.Second)
				newAPIClient(served.Addr, backendJWT).converse(t, "leak", "hello", 45*time.Second)

				env := append(env, signIn...)
				status, code := ps.run(t, name("status"), 30*time.Second, env, "status")
				require.Zero(t, code, "baton status should find nothing that needs attention:\n%s", status.Tail(30))
				status, code = ps.run(t, name("status --json"), 30*time.Second, env, "status", "--json")
				require.Zero(t, code, "baton status --json should find nothing that needs attention:\n%s", status.Tail(30))
				require.True(t, json.Valid([]byte(status.Text("stdout"))), "baton status --json should print JSON:\n%s", status.Text("stdout"))
				replay, code := ps.run(t, name("replay --dry-run"), 30*time.Second, env, "replay", "--group", "audit", "--all", "--dry-run")
				require.Zero(t, code, "baton replay --dry-run failed:\n%s", replay.Tail(10))
				require.Contains(t, replay.Text("stdout"), "dry run: group audit would replay")
				require.Contains(t, replay.Text("stdout"), "nothing was changed")
			})
		}
	})

	step("every kind of login worked")

	wrongNATSPassword := "nats:" + randomText(t) + "@/%"
	wrongDBPassword := "pg:" + randomText(t) + "@/#?&%"
	secrets = append(secrets,
		secret{Name: "wrong NATS password", Value: wrongNATSPassword},
		secret{Name: "wrong database password", Value: wrongDBPassword})
	nowhere, err := pgcluster.FreePort()
	require.NoError(t, err)
	t.Run("failing", func(t *testing.T) {
		db := "BATON_DATABASE_URL=" + dbURL("baton_failing")
		badNATS := "BATON_NATS_URL=" + natsURL(wrongNATSPassword, passwordAddr)
		goodNATS := "BATON_NATS_URL=" + natsURL(natsPassword, passwordAddr)
		noNATS := "BATON_NATS_URL=" + natsURL(natsPassword, "127.0.0.1:"+strconv.Itoa(nowhere))
		badDB := "BATON_DATABASE_URL=" + pg.TLSURL("baton", wrongDBPassword, "baton_failing")
		migrate, code := ps.run(t, "migrate", 30*time.Second, append([]string{db}, logs...), "migrate")
		require.Zero(t, code, "baton migrate failed:\n%s", migrate.Tail(10))

		shortSecret := "short:" + randomText(t)
		secrets = append(secrets, secret{Name: "short HS256 secret", Value: shortSecret})
		shortFile := filepath.Join(t.TempDir(), "short.secret")
		require.NoError(t, os.WriteFile(shortFile, []byte(shortSecret), 0o600))
		badSignIn := []string{"BATON_JWT_HS256_SECRET_FILE=" + shortFile, "BATON_JWT_HS256_ISSUER=" + backend, "BATON_JWT_AUDIENCE=" + audience}
		down := oidctest.NewKeyServer(t)
		down.Publish(issuerKey)
		down.SetMode(oidctest.Down)
		downSignIn := append([]string{"BATON_JWT_ISSUER=" + down.Issuer}, signIn[1:]...)
		openKey := filepath.Join(t.TempDir(), "open.pem")
		b, err := os.ReadFile(agentKey)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(openKey, b, 0o644))
		require.NoError(t, os.Chmod(openKey, 0o644))
		for _, run := range []struct {
			name string
			env  []string
			args []string
			// exit is the exit code of a command that ends by itself;
			// a service that keeps trying is stopped after it prints
			// waitFor.
			exit    int
			waitFor []string
		}{
			{"worker, wrong NATS password", []string{db, badNATS}, []string{"worker"}, 1, []string{"baton:", "Authorization Violation"}},
			{"replay --dry-run, wrong NATS password", []string{db, badNATS}, []string{"replay", "--group", "audit", "--all", "--dry-run"}, 1, []string{"baton:", "Authorization Violation"}},
			{"status, wrong NATS password", []string{db, badNATS}, []string{"status"}, 3, []string{"NATS is not reachable"}},
			{"relay, wrong NATS password", []string{db, badNATS, "BATON_SLOT=failing_password"}, []string{"relay"}, -1, []string{"cannot connect to NATS; retrying", "Authorization Violation", "BATON_NATS_URL"}},
			{"api, wrong NATS password", []string{db, badNATS, "BATON_HTTP_ADDR=127.0.0.1:0"}, []string{"api"}, -1, []string{"cannot connect to NATS; retrying", "Authorization Violation", "BATON_NATS_URL"}},
			{"migrate, wrong database password", []string{badDB}, []string{"migrate"}, 1, []string{"baton:", "password authentication failed"}},
			{"worker, wrong database password", []string{badDB, goodNATS}, []string{"worker"}, 1, []string{"baton:", "password authentication failed"}},
			{"relay, wrong database password", []string{badDB, goodNATS}, []string{"relay"}, 1, []string{"baton:", "password authentication failed"}},
			{"status, wrong database password", []string{badDB, goodNATS}, []string{"status"}, 1, []string{"baton:", "password authentication failed"}},
			{"worker, NATS not there", []string{db, noNATS}, []string{"worker"}, -1, []string{"cannot connect to NATS; retrying", "no servers available"}},
			{"status, NATS not there", []string{db, noNATS}, []string{"status", "--json"}, 3, []string{"NATS is not reachable"}},
			{"relay, NATS not there", []string{db, noNATS, "BATON_SLOT=failing_no_nats"}, []string{"relay"}, -1, []string{"cannot connect to NATS; retrying", "connection refused"}},
			{"api, HS256 secret too short", append([]string{db, goodNATS}, badSignIn...), []string{"api"}, 2, []string{"--jwt-hs256-secret-file", "must be at least 32 bytes"}},
			{"status, HS256 secret too short", append([]string{db, goodNATS}, badSignIn...), []string{"status"}, 2, []string{"--jwt-hs256-secret-file", "must be at least 32 bytes"}},
			{"api, the issuer's keys down", append([]string{db, goodNATS, "BATON_HTTP_ADDR=127.0.0.1:0"}, downSignIn...), []string{"api"}, -1, []string{"cannot fetch the JWT issuer's keys", "503 Service Unavailable"}},
			{"status, the issuer's keys down", append([]string{db, goodNATS}, downSignIn...), []string{"status", "--json"}, 3, []string{"JWT sign-in: the keys of issuer"}},
			{"api, agent key open to every user", []string{db, goodNATS, "BATON_AGENT_PUBLIC_KEY=" + openKey}, []string{"api"}, 2, []string{"--agent-public-key", "chmod 600"}},
			{"agent-key create over the key", nil, []string{"agent-key", "create", "--private-key", agentKey, "--public-key", openKey}, 1, []string{"exists already", "--force"}},
		} {
			t.Run(run.name, func(t *testing.T) {
				t.Parallel()
				p := ps.start(t, run.name, append(run.env, logs...), run.args...)
				p.WaitLine(t, 30*time.Second, run.waitFor...)
				if run.exit < 0 {
					p.Stop(15 * time.Second)
					return
				}
				require.Equal(t, run.exit, p.Wait(t, 30*time.Second), "exit code of %s:\n%s", run.name, p.Tail(10))
			})
		}
	})

	step("every failing run ended or said why")
	ps.stopAll()
	step("every process stopped")
	for _, tok := range tokens {
		lines := strings.Split(strings.TrimSpace(tok.Text("stdout")), "\n")
		secrets = append(secrets, secret{Name: "API token", Value: lines[len(lines)-1]})
	}
	ps.requireNoSecret(t, secrets, func(p *process, l outputLine, s secret) bool {
		// Each token is shown where it is made, and nowhere else.
		for _, tok := range tokens {
			if p == tok && l.Stream == "stdout" && s.Name == "API token" && strings.Contains(l.Text, s.Value) {
				return true
			}
		}
		return false
	})
}

// agentKeySecrets are the forms in which the Ed25519 private key in path
// could be written: its seed in base64, base64url and hex, and the body of
// its PEM file.
func agentKeySecrets(t *testing.T, path string) []secret {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	block, _ := pem.Decode(b)
	require.NotNil(t, block, "%s is PEM", path)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	require.NoError(t, err)
	seed := key.(ed25519.PrivateKey).Seed()
	return []secret{
		{Name: "agent key's seed, base64", Value: base64.StdEncoding.EncodeToString(seed)},
		{Name: "agent key's seed, base64url", Value: base64.RawURLEncoding.EncodeToString(seed)},
		{Name: "agent key's seed, hex", Value: hex.EncodeToString(seed)},
		{Name: "agent key's PEM body", Value: base64.StdEncoding.EncodeToString(block.Bytes)},
	}
}

// randomText returns 16 random hexadecimal digits: no secret of one run
// can match text of another.
func randomText(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// startPostgres starts a PostgreSQL cluster of the test's own that admits
// role, which it creates with password (and the right to stream
// replication, for the relay), only over TLS and with scram-sha-256, and
// creates each of dbs owned by role. The harness's superuser connects
// without TLS or password (pgcluster's own lines).
func startPostgres(t *testing.T, role, password string, dbs ...string) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "baton-securetest-pg-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// As root the server runs as postgres, which must reach its folder.
	require.NoError(t, os.Chmod(dir, 0o755))
	c, err := pgcluster.New(pgcluster.Options{
		Dir: filepath.Join(dir, "data"),
		TLS: true,
		HBA: []string{"hostssl all " + role + " 127.0.0.1/32 scram-sha-256"},
	})
	require.NoError(t, err)
	require.NoError(t, c.Init(ctx))
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(pgcluster.Fast) })
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN REPLICATION PASSWORD '"+strings.ReplaceAll(password, "'", "''")+"'")
	require.NoError(t, err)
	for _, db := range dbs {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+db+" OWNER "+role)
		require.NoError(t, err)
	}
	return c
}

// startNATS starts a NATS server with JetStream in this process, set up
// by configure, and returns its host:port. It stops when t ends.
func startNATS(t *testing.T, configure func(*server.Options)) string {
	t.Helper()
	return testenv.NATSServer(t, func(o *server.Options) {
		o.JetStream, o.StoreDir = true, t.TempDir()
		configure(o)
	})
}

// credsServer is a NATS server in operator (JWT) mode and a .creds file
// of one of its users.
type credsServer struct {
	addr, file string
	// jwt and seed are the user's, as the .creds file holds them.
	jwt, seed string
}

// startOperatorNATS starts a server that trusts a new operator, with an
// account (JetStream enabled) in a memory resolver, and writes a .creds
// file of a user of that account.
func startOperatorNATS(t *testing.T) credsServer {
	t.Helper()
	operator := testenv.NewNATSOperator(t)
	user := operator.User(t, "baton")
	addr := startNATS(t, operator.Configure)
	return credsServer{addr: addr, file: user.File, jwt: user.JWT, seed: string(user.Seed)}
}

// startNKeyNATS starts a server with one nkey user and returns the file
// of its seed and the server's host:port.
func startNKeyNATS(t *testing.T) (seedFile, addr string) {
	t.Helper()
	pub, seed := testenv.NKeyUser(t)
	seedFile = filepath.Join(t.TempDir(), "baton.nk")
	require.NoError(t, os.WriteFile(seedFile, append(seed, '\n'), 0o600))
	addr = startNATS(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	return seedFile, addr
}

// issuerKeyModulus is the RSA modulus of k's public key as its JWK writes
// it: key material that no output should hold.
func issuerKeyModulus(t *testing.T, k *oidctest.Key) string {
	t.Helper()
	pub, ok := k.JWK.Key.(*rsa.PublicKey)
	require.True(t, ok)
	return base64.RawURLEncoding.EncodeToString(pub.N.Bytes())
}
