package systemd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/deploy/deploytest"
	"github.com/batonhq/baton/deploy/nats/clustertest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/secretscan"
	"github.com/batonhq/baton/internal/testenv"
)

// The hosts the deploy files and the deploying guide (docs/guides/deploying.md) name, which addresses
// on this machine stand in for.
const (
	dbHost      = "db.internal:5432"
	webhookHost = "hooks.example.com"
)

// natsHosts are the three nodes of BATON_NATS_URL, in node order.
var natsHosts = []string{"n1.internal:4222", "n2.internal:4222", "n3.internal:4222"}

// roles are the PostgreSQL roles roles.sql makes, all of them given a
// password, as the deploying guide (docs/guides/deploying.md) does.
var roles = []string{"migrator", "api", "worker", "relay", "group", "status", "admin", "console"}

// brokenSigns are what a line of a healthy deployment never holds: each
// means a deploy file withholds something a component needs. Matched
// without regard to case.
var brokenSigns = []struct{ text, why string }{
	{"permission denied", "PostgreSQL refused a privilege the component's code uses (deploy/postgres/roles.sql, migration 00007's baton_grants)"},
	{"must be owner of", "PostgreSQL refused an owner's action (deploy/postgres/roles.sql)"},
	{"password authentication failed", "PostgreSQL refused the role's password"},
	{"no pg_hba.conf entry", "deploy/postgres/pg_hba.conf refused the connection"},
	{"permissions violation", "NATS refused a permission (deploy/nats/accounts.conf)"},
	{"refused an operation", "NATS refused a permission (deploy/nats/accounts.conf)"},
	{"authorization violation", "NATS refused the login (deploy/nats/accounts.conf, the nkey seed)"},
	{"certificate", "a TLS certificate was refused"},
	{`"level":"fatal"`, "a component died"},
	{`"level":"panic"`, "a component died"},
}

// deployment is one run of the deploy files, from nothing: PostgreSQL from
// deploy/postgres with TLS and the roles, the NATS cluster of deploy/nats,
// and every unit of deploy/systemd as a real process with the environment
// and the credentials systemd would give it.
type deployment struct {
	t *testing.T
	// files is the copy of deploy/ that is deployed.
	files string
	// root stands for the machine's /: /etc/baton, /etc/postgresql/tls,
	// /usr/local/bin/baton … of the deploying guide (docs/guides/deploying.md) are under it.
	root    string
	machine machine
	// variables is the rewrite table the run uses: variables, unless a
	// test changed a copy.
	variables map[string]rule
	step      func(string)

	// secrets are searched for in every output at the end; secretsMu
	// guards them, since the readers of the outputs mask them.
	secretsMu sync.Mutex
	secrets   []secretscan.Secret
	token     string
	// consoleToken is the operator token of baton token create --admin.
	consoleToken string
	webhookS     string
	modelKey     string

	pg       *pgcluster.Cluster
	pgLog    string
	su       *pgxpool.Pool
	model    *agenttest.Server
	hook     *webhookReceiver
	services map[string]*process
	runAs    *syscall.Credential

	modelMu sync.Mutex
	// modelCalls records the Authorization header and the model of each
	// request the fake model server received.
	modelCalls [][2]string

	// group is every process of the deployment.
	group proctest.Group

	mu     sync.Mutex
	err    error
	broken chan struct{}
}

// newDeployment prepares a run of the deploy files in files (a copy of
// deploy/). Nothing starts until run.
func newDeployment(t *testing.T, files string) *deployment {
	began := time.Now()
	d := &deployment{
		t: t, files: files, broken: make(chan struct{}), services: map[string]*process{}, variables: maps.Clone(variables),
		step: func(s string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), s) },
	}
	root, err := os.MkdirTemp("", "baton-deploy-")
	if err != nil {
		t.Fatal(err)
	}
	// The server runs as postgres and the services as an unprivileged
	// user: both reach what the deploying guide installs world-readable.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d.root = root
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	t.Cleanup(d.stopAll)
	if os.Geteuid() == 0 {
		// DynamicUser= gives each service a user of its own, with no
		// rights to anything but what is world-readable and its
		// credentials. nobody stands in for it.
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Fatalf("the services run as nobody, whom this machine lacks: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		d.runAs = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return d
}

// fail records the first failure of the deployment; every wait returns
// it.
func (d *deployment) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
		close(d.broken)
	}
}

func (d *deployment) failure() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

func (d *deployment) mask(s string) string { return secretscan.MaskAll(s, d.secretList()) }

// addSecret adds a secret that no output may hold.
func (d *deployment) addSecret(name, value string) {
	d.secretsMu.Lock()
	defer d.secretsMu.Unlock()
	d.secrets = append(d.secrets, secretscan.Secret{Name: name, Value: value})
}

func (d *deployment) secretList() []secretscan.Secret {
	d.secretsMu.Lock()
	defer d.secretsMu.Unlock()
	return slices.Clone(d.secrets)
}

// watch judges each line a service writes.
func (d *deployment) watch(p *process, l proctest.Line) {
	lower := strings.ToLower(l.Text)
	for _, s := range brokenSigns {
		if strings.Contains(lower, strings.ToLower(s.text)) {
			d.fail(fmt.Errorf("%s wrote %q (%s), %s line %d:\n    %s", p.Name, s.text, s.why, l.Stream, l.N, d.mask(l.Text)))
			return
		}
	}
}

// run starts a process of the deployment; service marks one that must run
// until the deployment stops it.
func (d *deployment) run(name string, service, unprivileged bool, dir string, env []string, bin string, args ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = dir
	opts := proctest.Options{OnLine: d.watch}
	if service {
		opts.OnExit = func(p *process) {
			if !p.Stopping() {
				d.fail(fmt.Errorf("%s exited (%v) while it should run; its last lines:\n%s", p.Name, p.ExitStatus(), p.Tail(15)))
			}
		}
	}
	var cred *syscall.Credential
	if unprivileged {
		cred = d.runAs
	}
	return d.start(name, cmd, cred, opts)
}

// runToEnd runs a command to its end, within timeout, and returns it with
// an error that says how it failed when it did not exit 0.
func (d *deployment) runToEnd(name string, timeout time.Duration, env []string, bin string, args ...string) (*process, error) {
	p, err := d.run(name, false, false, d.root, env, bin, args...)
	if err != nil {
		return nil, err
	}
	if err := p.AwaitExit(timeout); err != nil {
		p.Stop(5 * time.Second)
		return p, err
	}
	if code := p.ExitCode(); code != 0 {
		return p, fmt.Errorf("%s exited with status %d; its last lines:\n%s", name, code, p.Tail(20))
	}
	return p, d.failure()
}

// eventually polls cond, which reads state that offers no notification
// (a server, a database), until it holds, the deployment fails, or
// timeout passes; what says what is awaited.
func (d *deployment) eventually(timeout time.Duration, cond func() (ok bool, what string, err error)) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, what, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s, still waiting for %s", timeout, what)
		}
		select {
		case <-d.broken:
			return d.failure()
		case <-tick.C:
		}
	}
}

// waitLine waits until p writes a line holding every one of parts, or
// the deployment fails.
func (d *deployment) waitLine(p *process, timeout time.Duration, parts ...string) (string, error) {
	line, err := p.AwaitLine(d.broken, timeout, parts...)
	if errors.Is(err, proctest.ErrAborted) {
		return "", d.failure()
	}
	return line, err
}

// stopAll stops every process that still runs, as systemd stops a unit:
// SIGTERM, then SIGKILL after its TimeoutStopSec (capped, for the test).
// Nothing starts after it.
func (d *deployment) stopAll() { d.group.StopAll(30 * time.Second) }

// deploy runs the deployment and checks it, and returns the first thing
// that went wrong, named: a file the test cannot use as shipped, a command
// of the deploying guide that failed, a line that shows a refusal, a reply that
// did not come, a connection without TLS, a secret in an output.
func (d *deployment) deploy() error {
	testenv.StartPlainBatonBuild()
	if err := d.install(); err != nil {
		return err
	}
	// The units and the rewrite table first: a unit that sets a variable
	// the table does not know fails here, before anything starts.
	dry := d.machine
	dry.hosts = map[string]string{dbHost: "127.0.0.1:1", webhookHost: "127.0.0.1:1"}
	for _, h := range natsHosts {
		dry.hosts[h] = "127.0.0.1:1"
	}
	if _, err := plan(filepath.Join(d.files, "systemd"), dry, filepath.Join(d.root, "run", "credentials"), d.variables); err != nil {
		return err
	}
	d.step("the units and the rewrite table agree")

	d.startFakes()
	if err := d.startPostgres(); err != nil {
		return err
	}
	d.step("PostgreSQL runs with deploy/postgres's settings and TLS")
	if err := d.rolesSQL(); err != nil {
		return err
	}
	d.step("roles.sql made the roles and the database")
	nc := clustertest.Start(d.t, clustertest.Options{ConfDir: filepath.Join(d.files, "nats")})
	// Cleanups run last first: the services stop before the cluster does.
	d.t.Cleanup(d.stopAll)
	for i, h := range natsHosts {
		d.machine.hosts[h] = nc.Servers[i].Addr().String()
	}
	d.step("the NATS cluster of deploy/nats runs")
	if err := d.installBaton(nc); err != nil {
		return err
	}
	services, err := plan(filepath.Join(d.files, "systemd"), d.machine, filepath.Join(d.root, "run", "credentials"), d.variables)
	if err != nil {
		return err
	}
	bin := testenv.PlainBatonBinary(d.t)
	if err := os.Symlink(bin, filepath.Join(d.root, "usr", "local", "bin", "baton")); err != nil {
		return err
	}
	d.step("the binary is built and installed, /etc/baton holds the settings and the credentials")

	// baton-migrate first (the others are After= it), then the rest at
	// once.
	sort.SliceStable(services, func(i, j int) bool { return services[i].oneshot && !services[j].oneshot })
	for _, s := range services {
		d.t.Logf("%s: baton %s, rewritten: %s", s.unit, strings.Join(s.args, " "), strings.Join(s.rewritten, ", "))
		if err := d.startService(s); err != nil {
			return err
		}
		if s.oneshot {
			d.step(s.unit + " ran to its end")
		}
	}
	d.step("every service started")

	if err := d.converse(); err != nil {
		return err
	}
	d.step("a message posted through the API got the model's reply")
	if err := d.checkGroups(); err != nil {
		return err
	}
	d.step("the audit group recorded the event and the webhook group delivered it, signed")
	if err := d.checkLiveTLS(); err != nil {
		return err
	}
	d.step("every service's connections, the relay's replication included, use TLS")
	if err := d.status(); err != nil {
		return err
	}
	d.step("baton status, as baton_status, finds nothing to attend to")
	if err := d.console(); err != nil {
		return err
	}
	d.step("an operator token of baton token create --admin signs in to the console, which shows the turn and the groups")
	if err := d.heartbeat(); err != nil {
		return err
	}
	d.step("the relay's first heartbeat went through")
	if err := d.failure(); err != nil {
		return err
	}

	d.stopAll()
	d.step("every service stopped")
	if err := d.failure(); err != nil {
		return err
	}
	for _, p := range d.serviceList() {
		if code := p.ExitCode(); code != 0 {
			return fmt.Errorf("%s exited with status %d on SIGTERM, not cleanly; its last lines:\n%s", p.Name, code, p.Tail(15))
		}
	}
	// What a healthy deployment warns about, for whoever reads the log.
	for _, p := range d.serviceList() {
		for _, l := range p.Output() {
			if strings.Contains(l.Text, `"level":"warn"`) || strings.Contains(l.Text, `"level":"error"`) {
				d.t.Logf("%s warned: %s", p.Name, d.mask(l.Text))
			}
		}
	}
	if err := d.checkLoggedTLS(); err != nil {
		return err
	}
	d.step("every connection PostgreSQL logged was over TLS")
	return d.searchSecrets()
}

func (d *deployment) serviceList() []*process {
	var out []*process
	for _, u := range units {
		if p := d.services[u]; p != nil {
			out = append(out, p)
		}
	}
	return out
}

// secret returns a new random secret, as `openssl rand -hex n` makes one,
// and searches every output for it at the end.
func (d *deployment) secret(name string, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	d.addSecret(name, v)
	return v
}

// mkdir makes a folder under root, for a path of the deployment, with
// mode; the folders above it that it makes are world-readable, whatever
// the umask.
func (d *deployment) mkdir(p string, mode os.FileMode) (string, error) {
	here := filepath.Join(d.root, p)
	var made []string
	for dir := here; dir != d.root; dir = filepath.Dir(dir) {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		made = append(made, dir)
	}
	if err := os.MkdirAll(here, mode); err != nil {
		return "", err
	}
	for _, dir := range made {
		if err := os.Chmod(dir, 0o755); err != nil {
			return "", err
		}
	}
	return here, os.Chmod(here, mode)
}

// write writes a file of the deployment under root.
func (d *deployment) write(p string, data []byte, mode os.FileMode) error {
	here := filepath.Join(d.root, p)
	if _, err := d.mkdir(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(here, data, mode); err != nil {
		return err
	}
	return os.Chmod(here, mode)
}

// install makes what the deploying guide (docs/guides/deploying.md) installs before anything runs:
// the folders, and the environment files copied from deploy/systemd/env
// to /etc/baton.
func (d *deployment) install() error {
	d.machine = machine{root: d.root, hosts: map[string]string{}}
	for _, dir := range []string{"etc/baton/tls", "etc/postgresql/tls", "usr/local/bin", "root", "run/credentials", "etc/ssl/certs"} {
		if _, err := d.mkdir(dir, 0o755); err != nil {
			return err
		}
	}
	envs, err := filepath.Glob(filepath.Join(d.files, "systemd", "env", "*.env"))
	if err != nil {
		return err
	}
	for _, f := range envs {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := d.write(filepath.Join("etc", "baton", filepath.Base(f)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// webhookReceiver is where the webhook group POSTs: it checks each
// request's signature with the group's secret.
type webhookReceiver struct {
	*httptest.Server
	secret string

	mu       sync.Mutex
	received []webhookRequest
}

type webhookRequest struct {
	payload group.WebhookPayload
	signed  bool
}

func (h *webhookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var p group.WebhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		http.Error(w, "not a webhook payload", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.received = append(h.received, webhookRequest{payload: p, signed: group.VerifyWebhook(h.secret, body, r.Header.Get(group.HeaderWebhookSignature))})
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (h *webhookReceiver) requests() []webhookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]webhookRequest(nil), h.received...)
}

// startFakes starts what stands for the world outside: the model server
// (OpenAI's API) and the webhook's receiver (hooks.example.com, over
// TLS).
func (d *deployment) startFakes() {
	d.modelKey = d.secret("model API key", 24)
	d.model = agenttest.NewResponder(d.t, func(_ int, req agenttest.Request) agenttest.Response {
		d.modelMu.Lock()
		d.modelCalls = append(d.modelCalls, [2]string{req.Header.Get("Authorization"), req.Model})
		d.modelMu.Unlock()
		return agenttest.Response{Content: "deployed: " + req.LastUser()}
	})
	d.machine.modelBaseURL = d.model.BaseURL()

	d.webhookS = d.secret("webhook secret", 32)
	d.hook = &webhookReceiver{secret: d.webhookS}
	d.hook.Server = httptest.NewTLSServer(d.hook)
	d.t.Cleanup(d.hook.Close)
	d.machine.hosts[webhookHost] = d.hook.Listener.Addr().String()
	d.machine.trustStore = filepath.Join(d.root, "etc", "ssl", "certs", "ca-certificates.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d.hook.Certificate().Raw})
	if err := os.WriteFile(d.machine.trustStore, ca, 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// startPostgres starts PostgreSQL as the deploying guide (docs/guides/deploying.md) sets it up: a
// certificate for db.internal from make-certs.sh installed where tls.conf
// looks, the settings of baton.conf and tls.conf, and pg_hba.conf with
// the loopback network in place of the example one.
func (d *deployment) startPostgres() error {
	pg := d.files + "/postgres"
	certs := filepath.Join(d.root, "root", "pg-certs")
	cmd := exec.Command("bash", filepath.Join(d.files, "nats", "make-certs.sh"), certs, "db.internal")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("deploy/nats/make-certs.sh %s db.internal: %v\n%s", certs, err, out)
	}
	uid, gid, asPostgres := pgcluster.ServerUser()
	for _, f := range []struct {
		from, to string
		mode     os.FileMode
		server   bool
	}{
		{"db.internal.pem", "etc/postgresql/tls/server.crt", 0o644, false},
		{"ca.pem", "etc/postgresql/tls/ca.crt", 0o644, false},
		{"db.internal-key.pem", "etc/postgresql/tls/server.key", 0o600, true},
	} {
		b, err := os.ReadFile(filepath.Join(certs, f.from))
		if err != nil {
			return err
		}
		if err := d.write(f.to, b, f.mode); err != nil {
			return err
		}
		if f.server && asPostgres {
			if err := os.Chown(filepath.Join(d.root, f.to), uid, gid); err != nil {
				return err
			}
		}
	}

	settings := map[string]string{}
	for _, f := range []string{"baton.conf", "tls.conf"} {
		kv, err := deploytest.ReadConf(filepath.Join(pg, f))
		if err != nil {
			return err
		}
		for k, v := range kv {
			if filepath.IsAbs(v) {
				// A file of the server: where the test installed it.
				here, _ := d.machine.path(v)
				if _, err := os.Stat(here); err != nil {
					return fmt.Errorf("deploy/postgres/%s: %s = '%s', which the deploying guide (docs/guides/deploying.md) does not install: %v", f, k, v, err)
				}
				v = here
			}
			settings[k] = v
		}
	}
	// The test's own observation, not a deployment's setting: every
	// connection in the server's log, with its TLS.
	settings["log_connections"] = "on"
	hba, err := deploytest.ReadHBA(filepath.Join(pg, "pg_hba.conf"))
	if err != nil {
		return err
	}
	lib, err := d.mkdir("var/lib/postgresql", 0o755)
	if err != nil {
		return err
	}
	data := filepath.Join(lib, "data")
	logs, err := d.mkdir("var/log/postgresql", 0o755)
	if err != nil {
		return err
	}
	d.pgLog = filepath.Join(logs, "postgresql.log")
	c, err := pgcluster.New(pgcluster.Options{Dir: data, HBA: hba, Settings: settings, LogFile: d.pgLog})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Init(ctx); err != nil {
		return err
	}
	d.t.Cleanup(func() { _ = c.Stop(pgcluster.Fast) })
	if err := c.Start(ctx); err != nil {
		return fmt.Errorf("PostgreSQL with deploy/postgres's settings does not start: %w", err)
	}
	d.pg = c
	d.machine.hosts[dbHost] = fmt.Sprintf("127.0.0.1:%d", c.Port())
	return nil
}

// psqlEnv is the environment of the operator's shell, as far as a command
// of the deploying guide sees it: nothing of Baton's or PostgreSQL's unless given.
func psqlEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "LANG=C.UTF-8"}, extra...)
}

// rolesSQL runs deploy/postgres/roles.sql as the deploying guide (docs/guides/deploying.md) does:
// psql as the superuser, the file on its input, each role's password
// (openssl rand -hex 24) in its BATON_PG_<ROLE>_PASSWORD variable.
func (d *deployment) rolesSQL() error {
	binDir, err := pgcluster.FindBinDir()
	if err != nil {
		return err
	}
	env := psqlEnv()
	for _, r := range roles {
		env = append(env, "BATON_PG_"+strings.ToUpper(r)+"_PASSWORD="+d.secret("PostgreSQL password of baton_"+r, 24))
	}
	sql, err := os.Open(filepath.Join(d.files, "postgres", "roles.sql"))
	if err != nil {
		return err
	}
	defer sql.Close()
	cmd := exec.Command(filepath.Join(binDir, "psql"), "-X", "-d", d.pg.URL("postgres"))
	cmd.Env, cmd.Dir, cmd.Stdin = env, d.root, sql
	p, err := d.start("psql -X -d postgres < deploy/postgres/roles.sql", cmd, nil, proctest.Options{})
	if err != nil {
		return err
	}
	<-p.Done()
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("%s exited with status %d:\n%s", p.Name, code, p.Tail(10))
	}
	su, err := pgxpool.New(context.Background(), d.pg.URL("baton"))
	if err != nil {
		return err
	}
	d.t.Cleanup(su.Close)
	d.su = su
	return nil
}

// password returns the password roles.sql gave baton_<role>.
func (d *deployment) password(role string) string {
	for _, s := range d.secretList() {
		if s.Name == "PostgreSQL password of baton_"+role {
			return s.Value
		}
	}
	d.t.Fatalf("no password for baton_%s", role)
	return ""
}

// pgurl is the deploying guide's pgurl: the URL of baton_<role>, with the server's
// certificate checked against the CA of /etc/baton/tls (here).
func (d *deployment) pgurl(role string) string {
	ca, _ := d.machine.path("/etc/baton/tls/postgres-ca.crt")
	return fmt.Sprintf("postgres://baton_%s:%s@%s/baton?sslmode=verify-full&sslrootcert=%s\n", role, d.password(role), d.machine.hosts[dbHost], ca)
}

// installBaton does the deploying guide's step 5a up to the units: the CAs in
// /etc/baton/tls, and each unit's credentials in
// /etc/baton/credentials/<unit>/, root's only.
func (d *deployment) installBaton(nc *clustertest.Cluster) error {
	copyFile := func(from, to string, mode os.FileMode) error {
		b, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		return d.write(to, b, mode)
	}
	if err := copyFile(nc.CAFile(), "etc/baton/tls/nats-ca.pem", 0o644); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(d.root, "root", "pg-certs", "ca.pem"), "etc/baton/tls/postgres-ca.crt", 0o644); err != nil {
		return err
	}
	creds := "etc/baton/credentials"
	for _, c := range []string{"migrate", "api", "relay", "worker", "group", "group-audit", "group-webhook", "console"} {
		if _, err := d.mkdir(filepath.Join(creds, c), 0o700); err != nil {
			return err
		}
	}
	if err := d.write(filepath.Join(creds, "migrate", "database-url"), []byte(d.pgurl("migrator")), 0o600); err != nil {
		return err
	}
	for _, c := range []string{"api", "relay", "worker", "group", "console"} {
		if err := d.write(filepath.Join(creds, c, "database-url"), []byte(d.pgurl(c)), 0o600); err != nil {
			return err
		}
	}
	for _, c := range []string{"api", "relay", "worker", "group-audit", "group-webhook", "status", "console"} {
		seed, err := os.ReadFile(nc.SeedFile(c))
		if err != nil {
			return err
		}
		d.addSecret("nkey seed of "+c, strings.TrimSpace(string(seed)))
		if c == "status" {
			// Not a service's: the operator's, for baton status.
			if err := d.write("root/baton-nkeys/status.nk", seed, 0o600); err != nil {
				return err
			}
			continue
		}
		if err := d.write(filepath.Join(creds, c, "nats.nk"), seed, 0o600); err != nil {
			return err
		}
	}
	if err := d.write(filepath.Join(creds, "worker", "model-api-key"), []byte(d.modelKey+"\n"), 0o600); err != nil {
		return err
	}
	return d.write(filepath.Join(creds, "group-webhook", "webhook-secret"), []byte(d.webhookS+"\n"), 0o600)
}

// startService does what systemd does to start the unit: it copies each
// credential into the unit's credentials folder (%d), readable by the
// unit's user only, and runs ExecStart as that user, from /, with the
// unit's environment and nothing else. A oneshot unit is waited for.
func (d *deployment) startService(s *service) error {
	if err := os.MkdirAll(s.credDir, 0o700); err != nil {
		return err
	}
	for id, source := range s.credentials {
		b, err := os.ReadFile(source)
		if err != nil {
			return fmt.Errorf("%s: systemd would not start it: LoadCredential=%s: %w (the deploying guide (docs/guides/deploying.md) installs the credentials under /etc/baton/credentials)", s.unit, id, err)
		}
		to := filepath.Join(s.credDir, id)
		if err := os.WriteFile(to, b, 0o400); err != nil {
			return err
		}
		if d.runAs != nil {
			if err := os.Chown(to, int(d.runAs.Uid), int(d.runAs.Gid)); err != nil {
				return err
			}
		}
	}
	if d.runAs != nil {
		if err := os.Chown(s.credDir, int(d.runAs.Uid), int(d.runAs.Gid)); err != nil {
			return err
		}
	}
	if err := os.Chmod(s.credDir, 0o500); err != nil {
		return err
	}
	p, err := d.run(s.unit, !s.oneshot, true, "/", s.env, s.binary, s.args...)
	if err != nil {
		return err
	}
	d.services[s.unit] = p
	if !s.oneshot {
		return nil
	}
	// p is named after the unit.
	if err := p.AwaitExit(2 * time.Minute); err != nil {
		return err
	}
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("%s failed: baton %s exited with status %d; its last lines:\n%s", s.unit, strings.Join(s.args, " "), code, p.Tail(20))
	}
	return d.failure()
}

// operator runs a command of the deploying guide (docs/guides/deploying.md) in the operator's shell:
// the NATS variables it exports, the database URL of role from a file
// (<(pgurl role)), and the extra variables.
func (d *deployment) operator(name, role string, timeout time.Duration, extra []string, args ...string) (*process, error) {
	urlFile := filepath.Join(d.root, "root", "pgurl-"+role)
	if err := os.WriteFile(urlFile, []byte(d.pgurl(role)), 0o600); err != nil {
		return nil, err
	}
	natsURL, err := d.machine.rewrite("BATON_NATS_URL", strings.Join(func() []string {
		var out []string
		for _, h := range natsHosts {
			out = append(out, "tls://"+h)
		}
		return out
	}(), ","), hosts)
	if err != nil {
		return nil, err
	}
	ca, _ := d.machine.path("/etc/baton/tls/nats-ca.pem")
	env := psqlEnv(append([]string{"BATON_NATS_URL=" + natsURL, "BATON_NATS_TLS_CA=" + ca, "BATON_DATABASE_URL_FILE=" + urlFile}, extra...)...)
	bin, _ := d.machine.path("/usr/local/bin/baton")
	return d.runToEnd(name, timeout, env, bin, args...)
}

// converse makes a token as the deploying guide does (baton token create, as
// baton_admin), and posts a message through the API, whose reply must
// come from the model server with the worker's key.
func (d *deployment) converse() error {
	tok, err := d.operator("baton token create --user alice", "admin", time.Minute, nil, "token", "create", "--user", "alice")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(tok.Text("stdout")), "\n")
	d.token = lines[len(lines)-1]
	d.addSecret("API token", d.token)

	line, err := d.waitLine(d.services["baton-api.service"], time.Minute, `"serving HTTP API"`)
	if err != nil {
		return err
	}
	var served struct{ Addr string }
	if err := json.Unmarshal([]byte(line), &served); err != nil || served.Addr == "" {
		return fmt.Errorf("baton-api.service: the line that says where it serves is not JSON with addr (BATON_LOG_FORMAT=json): %s", line)
	}
	api := "http://" + served.Addr
	call := func(method, path string, body any) (int, map[string]any, error) {
		var r io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			r = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, api+path, r)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+d.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
		if err != nil {
			return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		defer resp.Body.Close()
		var out map[string]any
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &out)
		return resp.StatusCode, out, nil
	}
	if code, body, err := call(http.MethodPost, "/v1/conversations", map[string]string{"id": "deploy", "title": "Deployed"}); err != nil || code != http.StatusCreated {
		return fmt.Errorf("creating a conversation through the API: %d %v %v", code, body, err)
	}
	content := "hello from the deploy test"
	if code, body, err := call(http.MethodPost, "/v1/conversations/deploy/messages", map[string]string{"id": "m1", "content": content}); err != nil || code != http.StatusAccepted {
		return fmt.Errorf("posting a message through the API: %d %v %v", code, body, err)
	}
	want := "deployed: " + content
	err = d.eventually(90*time.Second, func() (bool, string, error) {
		code, body, err := call(http.MethodGet, "/v1/conversations/deploy/messages", nil)
		if err != nil || code != http.StatusOK {
			return false, "", fmt.Errorf("listing the messages through the API: %d %v %v", code, body, err)
		}
		msgs, _ := body["messages"].([]any)
		for _, m := range msgs {
			msg, _ := m.(map[string]any)
			switch msg["role"] {
			case "assistant":
				return msg["content"] == want, fmt.Sprintf("the reply %q (got %q)", want, msg["content"]), nil
			case "error":
				return false, "", fmt.Errorf("the turn failed instead of replying: %v", msg["content"])
			}
		}
		return false, fmt.Sprintf("the reply %q (the messages: %v)", want, msgs), nil
	})
	if err != nil {
		return err
	}
	d.modelMu.Lock()
	calls := slices.Clone(d.modelCalls)
	d.modelMu.Unlock()
	model, _ := deploytest.ReadEnvFile(filepath.Join(d.root, "etc", "baton", "worker.env"))
	for _, c := range calls {
		if c[0] != "Bearer "+d.modelKey {
			return fmt.Errorf("the worker called the model server without the key of its credential model-api-key (Authorization %q)", d.mask(c[0]))
		}
		if c[1] != model["BATON_MODEL"] {
			return fmt.Errorf("the worker asked for model %q, worker.env says %q", c[1], model["BATON_MODEL"])
		}
	}
	return nil
}

// checkGroups waits for the audit group's row of the message's event and
// the webhook group's signed request.
func (d *deployment) checkGroups() error {
	ctx := context.Background()
	var outbox []int64
	if err := d.su.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM agent_outbox`).Scan(&outbox); err != nil {
		return err
	}
	if len(outbox) != 1 {
		return fmt.Errorf("want the one outbox row of the message, have %v", outbox)
	}
	err := d.eventually(60*time.Second, func() (bool, string, error) {
		var n int
		if err := d.su.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE group_name = 'audit' AND outbox_id = $1`, outbox[0]).Scan(&n); err != nil {
			return false, "", err
		}
		return n > 0, fmt.Sprintf("the audit group's row for outbox row %d in audit_events", outbox[0]), nil
	})
	if err != nil {
		return err
	}
	return d.eventually(60*time.Second, func() (bool, string, error) {
		for _, r := range d.hook.requests() {
			if !r.signed {
				return false, "", fmt.Errorf("the webhook group's request for event %s is not signed with its credential webhook-secret", r.payload.EventID)
			}
			if r.payload.OutboxID == outbox[0] {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("the webhook group's request for outbox row %d (%d requests so far)", outbox[0], len(d.hook.requests())), nil
	})
}

// checkLiveTLS waits until every long-running service has a connection to
// PostgreSQL and the relay streams, and checks that each of their
// connections, the relay's replication connection included, uses TLS.
func (d *deployment) checkLiveTLS() error {
	ctx := context.Background()
	want := []string{"baton_api client backend", "baton_worker client backend", "baton_relay client backend", "baton_relay walsender", "baton_group client backend", "baton_console client backend"}
	return d.eventually(60*time.Second, func() (bool, string, error) {
		rows, err := d.su.Query(ctx, `
			SELECT a.usename || ' ' || a.backend_type, coalesce(s.ssl, false), coalesce(s.version, ''),
			       coalesce((SELECT r.state FROM pg_stat_replication r WHERE r.pid = a.pid), '')
			FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s ON s.pid = a.pid
			WHERE a.usename LIKE 'baton\_%'`)
		if err != nil {
			return false, "", err
		}
		defer rows.Close()
		seen := map[string]bool{}
		for rows.Next() {
			var who, version, state string
			var ssl bool
			if err := rows.Scan(&who, &ssl, &version, &state); err != nil {
				return false, "", err
			}
			if !ssl {
				return false, "", fmt.Errorf("a connection of %s is not over TLS (pg_stat_ssl)", who)
			}
			if strings.HasSuffix(who, "walsender") && state != "streaming" {
				continue
			}
			seen[who] = true
		}
		if err := rows.Err(); err != nil {
			return false, "", err
		}
		var missing []string
		for _, w := range want {
			if !seen[w] {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0, fmt.Sprintf("connections over TLS of %s (pg_stat_ssl, pg_stat_replication)", strings.Join(missing, ", ")), nil
	})
}

// checkLoggedTLS reads every connection of a Baton role that PostgreSQL
// logged, the short-lived ones of baton migrate, token create and status
// included: each was over TLS.
func (d *deployment) checkLoggedTLS() error {
	b, err := os.ReadFile(d.pgLog)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		_, rest, ok := strings.Cut(line, "connection authorized: user=baton_")
		if !ok {
			continue
		}
		role, _, _ := strings.Cut(rest, " ")
		if strings.Contains(line, "replication connection authorized") {
			role += " (replication)"
		}
		if !strings.Contains(line, "SSL enabled (protocol=TLSv1.3") {
			return fmt.Errorf("PostgreSQL logged a connection of baton_%s without TLS 1.3: %s", role, d.mask(line))
		}
		seen[role] = true
	}
	for _, r := range []string{"migrator", "api", "worker", "relay", "relay (replication)", "group", "admin", "status", "console"} {
		if !seen[r] {
			return fmt.Errorf("PostgreSQL logged no connection of baton_%s (log_connections)", r)
		}
	}
	return nil
}

// status runs baton status as the deploying guide (docs/guides/deploying.md) does: as baton_status,
// with the status user's nkey seed.
func (d *deployment) status() error {
	seed, _ := d.machine.path("/root/baton-nkeys/status.nk")
	_, err := d.operator("baton status", "status", time.Minute, []string{"BATON_NATS_NKEY_SEED=" + seed}, "status")
	return err
}

// console makes an operator token as the deploying guide does (baton
// token create --admin, as baton_admin), signs in to baton-console with
// it and reads the overview and the conversation of the message: the
// console reads them as baton_console, and NATS as the console user.
func (d *deployment) console() error {
	tok, err := d.operator("baton token create --user ops --admin", "admin", time.Minute, nil, "token", "create", "--user", "ops", "--admin")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(tok.Text("stdout")), "\n")
	d.consoleToken = lines[len(lines)-1]
	d.addSecret("console token", d.consoleToken)
	line, err := d.waitLine(d.services["baton-console.service"], time.Minute, `"serving the operator console"`)
	if err != nil {
		return err
	}
	var served struct{ Addr string }
	if err := json.Unmarshal([]byte(line), &served); err != nil || served.Addr == "" {
		return fmt.Errorf("baton-console.service: the line that says where it serves is not JSON with addr (BATON_LOG_FORMAT=json): %s", line)
	}
	base := "http://" + served.Addr
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 15 * time.Second}
	page := func(resp *http.Response, err error) (int, string, error) {
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	code, body, err := page(c.Get(base + "/signin"))
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("baton-console.service: GET /signin: %d %v", code, err)
	}
	nonce := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if nonce == nil {
		return fmt.Errorf("baton-console.service: the sign-in page has no form")
	}
	code, body, err = page(c.PostForm(base+"/signin", url.Values{"csrf": {nonce[1]}, "token": {d.consoleToken}}))
	if err != nil || code != http.StatusOK || !strings.Contains(body, "turns running") {
		return fmt.Errorf("baton-console.service: signing in with the operator token led to %d, not the overview (%v): %s", code, err, d.mask(body))
	}
	return d.eventually(30*time.Second, func() (bool, string, error) {
		code, body, err := page(c.Get(base + "/overview/live"))
		if err != nil || code != http.StatusOK {
			return false, "", fmt.Errorf("baton-console.service: GET /overview/live: %d %v", code, err)
		}
		_, conversations, err := page(c.Get(base + "/conversations?user=alice"))
		if err != nil {
			return false, "", err
		}
		ok := strings.Contains(body, ">audit<") && strings.Contains(body, ">turns<") && strings.Contains(conversations, "deploy")
		return ok, "the console's overview lists the groups audit and turns (from NATS, as the console user), and the conversations of alice the conversation deploy", nil
	})
}

// heartbeat waits until the relay recorded its slot's progress twice: its
// first heartbeat (a logical decoding message, emitted right after the
// first record) has then ended, and a refusal of it is in the relay's
// output.
func (d *deployment) heartbeat() error {
	ctx := context.Background()
	var first time.Time
	return d.eventually(60*time.Second, func() (bool, string, error) {
		var at time.Time
		err := d.su.QueryRow(ctx, `SELECT coalesce(max(observed_at), 'epoch') FROM relay_slot_progress`).Scan(&at)
		if err != nil {
			return false, "", err
		}
		if first.IsZero() && at.Unix() > 0 {
			first = at
		}
		return !first.IsZero() && at.After(first), "the relay's second record of its slot's progress (relay_slot_progress), after its first heartbeat", nil
	})
}

// searchSecrets searches every line every process wrote, and the server's
// log, for every secret of the deployment. The one line allowed one is
// the token that baton token create prints.
func (d *deployment) searchSecrets() error {
	all := d.group.All()
	secrets := d.secretList()
	var found []string
	lines := 0
	for _, p := range all {
		for _, l := range p.Output() {
			lines++
			for _, s := range secrets {
				if s.In(l.Text) == "" || (s.Name == "API token" && l.Stream == "stdout" && l.Text == d.token && strings.HasPrefix(p.Name, "baton token create")) ||
					(s.Name == "console token" && l.Stream == "stdout" && l.Text == d.consoleToken && strings.HasPrefix(p.Name, "baton token create")) {
					continue
				}
				found = append(found, fmt.Sprintf("%s wrote the %s on %s, line %d:\n    %s", p.Name, s.Name, l.Stream, l.N, d.mask(l.Text)))
			}
		}
	}
	if b, err := os.ReadFile(d.pgLog); err == nil {
		for i, l := range strings.Split(string(b), "\n") {
			lines++
			for _, s := range secrets {
				if s.In(l) != "" {
					found = append(found, fmt.Sprintf("PostgreSQL's log holds the %s, line %d:\n    %s", s.Name, i+1, d.mask(l)))
				}
			}
		}
	}
	d.t.Logf("searched %d lines of %d processes and the server's log for %d secrets", lines, len(all), len(secrets))
	if len(found) > 0 {
		return errors.New(strings.Join(found, "\n"))
	}
	return nil
}
