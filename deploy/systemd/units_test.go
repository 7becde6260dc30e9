package systemd_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/batonhq/baton/deploy/deploytest"
)

// units are the units the test runs: every unit of deploy/systemd, the
// template once per group the deploying guide starts.
var units = []string{
	"baton-migrate.service",
	"baton-api.service",
	"baton-console.service",
	"baton-relay.service",
	"baton-worker.service",
	"baton-group@audit.service",
	"baton-group@webhook.service",
}

// groupInstances are the instances of baton-group@.service.
var groupInstances = []string{"audit", "webhook"}

// rule is what the test does with the value of a variable that a deploy
// file sets.
type rule int

const (
	// keep passes the value as shipped (after systemd's own %d).
	keep rule = iota
	// hosts replaces each host of the URL(s) in the value with the
	// address that stands for it on this machine (machine.hosts).
	hosts
	// paths puts the value, an absolute path, under the folder that
	// stands for / on this machine (machine.root).
	paths
	// anyPort replaces a listen address with 127.0.0.1:0: the shipped
	// port may be taken here, and the test reads the one in use from the
	// log.
	anyPort
)

func (r rule) String() string {
	return [...]string{"kept", "its hosts replaced", "its path moved", "a free port"}[r]
}

// variables is the rewrite table: what the test does with each variable
// the units and their environment files set. Only values that name this
// machine's hosts, paths and ports change; names never do. A variable the
// files set that is not listed fails the test (a renamed variable is
// caught here, before anything runs), and so does a listed one that no
// file sets any more.
var variables = map[string]rule{
	"BATON_LOG_FORMAT":          keep,
	"BATON_REPLICAS":            keep,
	"BATON_MODEL":               keep,
	"BATON_DATABASE_URL_FILE":   keep, // %d/database-url, a credential
	"BATON_NATS_NKEY_SEED":      keep, // %d/nats-nkey-seed, a credential
	"BATON_MODEL_API_KEY_FILE":  keep, // %d/model-api-key, a credential
	"BATON_WEBHOOK_SECRET_FILE": keep, // %d/webhook-secret, a credential
	"BATON_NATS_URL":            hosts,
	"BATON_WEBHOOK_URL":         hosts,
	"BATON_NATS_TLS_CA":         paths,
	"BATON_HTTP_ADDR":           anyPort,
	"BATON_CONSOLE_ADDR":        anyPort,
}

// added are the variables the test gives a unit that no deploy file sets,
// each standing for something of the machine, not of Baton's settings.
var added = map[string]map[string]func(m machine) string{
	// worker.env leaves the model server to its default, OpenAI's API; the
	// test's fake server stands in for it.
	"baton-worker.service": {"BATON_MODEL_BASE_URL": func(m machine) string { return m.modelBaseURL }},
	// The webhook's receiver has a certificate of the test's CA, which the
	// machine's trust store (Debian's bundle, under the test's root)
	// holds.
	"baton-group@webhook.service": {"SSL_CERT_FILE": func(m machine) string { return m.trustStore }},
}

// unsupported are unit settings that would change a service's command,
// environment or files, which the test does not do as systemd would: a
// unit that starts using one must teach the test first.
var unsupported = []string{
	"ExecStartPre", "ExecStartPost", "ExecCondition", "PassEnvironment", "UnsetEnvironment",
	"SetCredential", "SetCredentialEncrypted", "LoadCredentialEncrypted", "ImportCredential",
	"WorkingDirectory", "RootDirectory", "RootImage", "BindPaths", "BindReadOnlyPaths", "TemporaryFileSystem",
	"StateDirectory", "RuntimeDirectory", "CacheDirectory", "LogsDirectory", "ConfigurationDirectory",
}

// systemdPath is the PATH systemd gives a system service.
const systemdPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// machine is what stands for the deployment's machines here.
type machine struct {
	// root stands for /: the files the deploying guide installs are under it.
	root string
	// hosts maps each host[:port] the deploy files name to an address
	// here.
	hosts map[string]string
	// modelBaseURL is the fake model server's.
	modelBaseURL string
	// trustStore is the file of the machine's trusted CAs.
	trustStore string
}

// path returns where an absolute path of the deployment is here.
func (m machine) path(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%q is not an absolute path", p)
	}
	return filepath.Join(m.root, p), nil
}

// rewrite returns v, the value of variable name, as the test gives it.
func (m machine) rewrite(name, v string, r rule) (string, error) {
	switch r {
	case keep:
		return v, nil
	case paths:
		return m.path(v)
	case anyPort:
		if _, _, err := net.SplitHostPort(v); err != nil {
			return "", fmt.Errorf("%s=%s is not a listen address: %v", name, v, err)
		}
		return "127.0.0.1:0", nil
	case hosts:
		var out []string
		for _, item := range strings.Split(v, ",") {
			u, err := url.Parse(strings.TrimSpace(item))
			if err != nil || u.Host == "" {
				return "", fmt.Errorf("%s=%s: %q is not a URL with a host", name, v, item)
			}
			here, ok := m.hosts[u.Host]
			if !ok {
				known := make([]string, 0, len(m.hosts))
				for h := range m.hosts {
					known = append(known, h)
				}
				sort.Strings(known)
				return "", fmt.Errorf("%s=%s names host %s, which the deploy test does not stand in for (it knows %s)", name, v, u.Host, strings.Join(known, ", "))
			}
			u.Host = here
			out = append(out, u.String())
		}
		return strings.Join(out, ","), nil
	}
	return "", fmt.Errorf("no rule %d", r)
}

// service is a unit as the test runs it: what systemd would run.
type service struct {
	unit    string
	oneshot bool
	// user is the unit's User=, which the environment names.
	user string
	// binary is ExecStart's program, here; args follow it.
	binary string
	args   []string
	// env is the whole environment, sorted: systemd's own variables and
	// the unit's, rewritten by the table.
	env []string
	// credentials maps each credential's id to its file here, which the
	// test copies into the credentials folder (%d) before the start.
	credentials map[string]string
	// credDir is %d.
	credDir string
	// rewritten lists, for the log, each variable the table changed.
	rewritten []string
}

// plan reads the units of dir (the deploy files' systemd folder) and the
// environment files they name as installed under m.root, and returns the
// services as systemd would run them on m, with the credentials folders
// under credRoot and the variables rewritten by the table variables. Its
// errors name the file and the variable at fault.
func plan(dir string, m machine, credRoot string, variables map[string]rule) ([]*service, error) {
	all, err := deploytest.Units(dir, groupInstances...)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, u := range all {
		names = append(names, u.Name)
	}
	for _, want := range units {
		if !slices.Contains(names, want) {
			return nil, fmt.Errorf("deploy/systemd has no unit %s, which the deploying guide (docs/guides/deploying.md) starts", want)
		}
	}
	used := map[string]bool{}
	var out []*service
	for _, u := range all {
		if !slices.Contains(units, u.Name) {
			return nil, fmt.Errorf("deploy/systemd/%s is a unit the deploy test does not run: add it to units in deploy/systemd/units_test.go", u.Name)
		}
		s, err := planUnit(u, m, credRoot, variables, used)
		if err != nil {
			return nil, fmt.Errorf("deploy/systemd/%s: %w", u.Name, err)
		}
		out = append(out, s)
	}
	var unused []string
	for v := range variables {
		if !used[v] {
			unused = append(unused, v)
		}
	}
	if len(unused) > 0 {
		sort.Strings(unused)
		return nil, fmt.Errorf("no deploy file sets %s any more, which the deploy test's table lists: a renamed variable? (update variables in deploy/systemd/units_test.go)", strings.Join(unused, ", "))
	}
	return out, nil
}

func planUnit(u deploytest.Unit, m machine, credRoot string, variables map[string]rule, used map[string]bool) (*service, error) {
	for _, k := range unsupported {
		if len(u.All(k)) > 0 {
			return nil, fmt.Errorf("%s= is set, which the deploy test does not do as systemd does: teach it (deploy/systemd/units_test.go)", k)
		}
	}
	s := &service{unit: u.Name, credentials: map[string]string{}, credDir: filepath.Join(credRoot, u.Name)}
	switch t := u.All("Type"); {
	case len(t) == 1 && t[0] == "oneshot":
		s.oneshot = true
	case len(t) == 1 && (t[0] == "exec" || t[0] == "simple"):
	default:
		return nil, fmt.Errorf("Type=%v: the deploy test runs oneshot, exec and simple services", t)
	}
	if users := u.All("User"); len(users) == 1 {
		s.user = users[0]
	}
	exec := u.All("ExecStart")
	if len(exec) != 1 {
		return nil, fmt.Errorf("%d ExecStart= lines; the deploy test runs one", len(exec))
	}
	fields := strings.Fields(exec[0])
	if len(fields) == 0 || strings.ContainsAny(exec[0], `"'\$;`) {
		return nil, fmt.Errorf("ExecStart=%s: the deploy test splits a command at spaces, without quotes, variables or specifiers", exec[0])
	}
	bin, err := m.path(fields[0])
	if err != nil {
		return nil, fmt.Errorf("ExecStart=%s: %w", exec[0], err)
	}
	s.binary, s.args = bin, fields[1:]
	for _, a := range s.args {
		if strings.Contains(a, "%") {
			return nil, fmt.Errorf("ExecStart=%s: a specifier the deploy test does not fill in", exec[0])
		}
	}

	for _, c := range u.All("LoadCredential") {
		id, source, ok := strings.Cut(c, ":")
		if !ok || id == "" || strings.Contains(id, "/") {
			return nil, fmt.Errorf("LoadCredential=%s is not ID:PATH", c)
		}
		here, err := m.path(source)
		if err != nil {
			return nil, fmt.Errorf("LoadCredential=%s: %w", c, err)
		}
		s.credentials[id] = here
	}

	// Environment= first; EnvironmentFile= settings override them, as
	// systemd's do. where says which file set each variable.
	env, where := map[string]string{}, map[string]string{}
	for _, line := range u.All("Environment") {
		assignments, err := deploytest.Assignments(line)
		if err != nil {
			return nil, err
		}
		for _, a := range assignments {
			k, v, _ := strings.Cut(a, "=")
			v, err := specifiers(v, s.credDir)
			if err != nil {
				return nil, fmt.Errorf("Environment=%s: %w", a, err)
			}
			env[k], where[k] = v, u.Name
		}
	}
	for _, f := range u.All("EnvironmentFile") {
		optional := strings.HasPrefix(f, "-")
		f = strings.TrimPrefix(f, "-")
		here, err := m.path(f)
		if err != nil {
			return nil, fmt.Errorf("EnvironmentFile=%s: %w", f, err)
		}
		kv, err := deploytest.ReadEnvFile(here)
		if os.IsNotExist(err) && optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("EnvironmentFile=%s, which systemd cannot read: %w (the deploying guide (docs/guides/deploying.md) copies deploy/systemd/env/*.env to /etc/baton/)", f, err)
		}
		for k, v := range kv {
			env[k], where[k] = v, "env/"+filepath.Base(f)
		}
	}

	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r, ok := variables[k]
		if !ok {
			return nil, fmt.Errorf("%s sets %s, which the deploy test neither keeps nor rewrites: a renamed or new variable? (add it to variables in deploy/systemd/units_test.go once the binary reads it)", where[k], k)
		}
		used[k] = true
		v, err := m.rewrite(k, env[k], r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where[k], err)
		}
		if v != env[k] {
			s.rewritten = append(s.rewritten, fmt.Sprintf("%s (%s)", k, r))
		}
		env[k] = v
	}
	for k, value := range added[u.Name] {
		if _, set := env[k]; set {
			return nil, fmt.Errorf("%s sets %s, which the deploy test adds: drop it from added in deploy/systemd/units_test.go", where[k], k)
		}
		env[k] = value(m)
		s.rewritten = append(s.rewritten, k+" (added)")
	}

	// What systemd itself puts in a service's environment.
	env["PATH"] = systemdPath
	env["CREDENTIALS_DIRECTORY"] = s.credDir
	if s.user != "" {
		env["USER"], env["LOGNAME"], env["HOME"] = s.user, s.user, "/"
	}
	for k, v := range env {
		s.env = append(s.env, k+"="+v)
	}
	sort.Strings(s.env)
	sort.Strings(s.rewritten)
	return s, nil
}

// specifiers fills in the systemd specifiers of v that the units use: %d,
// the credentials folder, and %% (ReadUnit filled in %i).
func specifiers(v, credDir string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			b.WriteByte(v[i])
			continue
		}
		if i+1 == len(v) {
			return "", fmt.Errorf("a lone %% at the end")
		}
		i++
		switch v[i] {
		case 'd':
			b.WriteString(credDir)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("specifier %%%c, which the deploy test does not fill in", v[i])
		}
	}
	return b.String(), nil
}
