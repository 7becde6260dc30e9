package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/deploy/deploytest"
	"github.com/batonhq/baton/internal/cli"
)

// secretVariables are the settings that hold secrets. Each is read from
// the file its <VAR>_FILE names, which is how the deployment files give
// them; none may be set as a value. BATON_NATS_URL holds one only when it
// carries a password, which the tests refuse: the shipped files log in
// with nkeys.
var secretVariables = []string{"BATON_DATABASE_URL", "BATON_MODEL_API_KEY", "BATON_WEBHOOK_SECRET"}

// fileVariables are the secret settings whose <VAR>_FILE the binary reads.
var fileVariables = []string{"BATON_DATABASE_URL", "BATON_NATS_URL", "BATON_MODEL_API_KEY", "BATON_WEBHOOK_SECRET"}

// invocation is one way a deployment file runs the binary: its arguments
// after `baton` and the variables it sets.
type invocation struct {
	where string
	args  []string
	// env maps each variable set to where it is set.
	env map[string]string
}

// check returns what in inv the binary would not read: a command it does
// not have, a flag the command does not take, a BATON_* variable none of
// its flags reads.
func check(inv invocation, flags map[string][]cli.Flag) []error {
	var command string
	rest := inv.args
	for i := range inv.args {
		if strings.HasPrefix(inv.args[i], "-") {
			break
		}
		if words := strings.Join(inv.args[:i+1], " "); flags[words] != nil {
			command, rest = words, inv.args[i+1:]
		}
	}
	if command == "" {
		return []error{fmt.Errorf("%s: `baton %s` is no command of the binary", inv.where, strings.Join(inv.args, " "))}
	}
	names, envs := map[string]bool{}, map[string]bool{}
	for _, f := range flags[command] {
		names[f.Name] = true
		for _, e := range f.Envs {
			envs[e] = true
			if slices.Contains(fileVariables, e) {
				envs[e+"_FILE"] = true
			}
		}
	}
	var errs []error
	for _, a := range rest {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !names[name] {
			errs = append(errs, fmt.Errorf("%s: `baton %s` has no flag --%s", inv.where, command, name))
		}
	}
	vars := make([]string, 0, len(inv.env))
	for v := range inv.env {
		vars = append(vars, v)
	}
	slices.Sort(vars)
	for _, v := range vars {
		if strings.HasPrefix(v, "BATON_") && !envs[v] {
			errs = append(errs, fmt.Errorf("%s: `baton %s` reads no variable %s", inv.env[v], command, v))
		}
	}
	return errs
}

// kubernetesInvocations are the containers of the manifests in dir.
func kubernetesInvocations(t *testing.T, dir string) []invocation {
	t.Helper()
	ms, err := decodeManifests(dir)
	require.NoError(t, err)
	var out []invocation
	for _, m := range ms {
		pod, name, ok := podOf(m)
		if !ok {
			continue
		}
		for _, c := range pod.Spec.Containers {
			where := fmt.Sprintf("%s: %s, container %s", m.file, name, c.Name)
			inv := invocation{where: where, args: append(slices.Clone(c.Command), c.Args...), env: map[string]string{}}
			require.Empty(t, c.EnvFrom, "%s: variables are listed in the manifest, so that they can be checked", where)
			for _, e := range c.Env {
				inv.env[e.Name] = where
			}
			out = append(out, inv)
		}
	}
	return out
}

// systemdUnits reads the units of dir, the template once per group.
func systemdUnits(t *testing.T, dir string) []deploytest.Unit {
	t.Helper()
	units, err := deploytest.Units(dir, "audit", "webhook")
	require.NoError(t, err)
	return units
}

// envFile reads the KEY=VALUE lines of an environment file.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	env, err := deploytest.ReadEnvFile(path)
	require.NoError(t, err)
	return env
}

// systemdInvocations are the units of dir with their environment: the
// Environment= lines and the files of EnvironmentFile=, which the units
// name under /etc/baton/ and dir/env holds.
func systemdInvocations(t *testing.T, dir string) []invocation {
	t.Helper()
	var out []invocation
	for _, u := range systemdUnits(t, dir) {
		exec := u.All("ExecStart")
		require.Len(t, exec, 1, u.Name)
		fields := strings.Fields(exec[0])
		require.Equal(t, "/usr/local/bin/baton", fields[0], "%s runs the installed binary", u.Name)
		inv := invocation{where: u.Name, args: fields[1:], env: map[string]string{}}
		for _, line := range u.All("Environment") {
			assignments, err := deploytest.Assignments(line)
			require.NoError(t, err, u.Name)
			for _, e := range assignments {
				k, _, _ := strings.Cut(e, "=")
				inv.env[k] = u.Name
			}
		}
		for _, f := range u.All("EnvironmentFile") {
			optional := strings.HasPrefix(f, "-")
			f = strings.TrimPrefix(f, "-")
			require.True(t, strings.HasPrefix(f, "/etc/baton/"), "%s: environment files live in /etc/baton", u.Name)
			local := filepath.Join(dir, "env", filepath.Base(f))
			if _, err := os.Stat(local); err != nil && optional {
				continue
			}
			for k := range envFile(t, local) {
				inv.env[k] = "env/" + filepath.Base(f)
			}
		}
		out = append(out, inv)
	}
	return out
}

// TestDeployFilesSetOnlyFlagsAndVariablesTheBinaryReads: every flag and
// BATON_* variable that the Kubernetes manifests, the systemd units and
// their environment files set is one that the command they run reads
// (the binary's own flags, from internal/cli), and each runs every
// component.
func TestDeployFilesSetOnlyFlagsAndVariablesTheBinaryReads(t *testing.T) {
	t.Parallel()
	flags := cli.Flags()
	require.NotEmpty(t, flags["api"])
	require.NotEmpty(t, flags["group run"])
	require.Equal(t, flags["migrate up"], flags["migrate"], "`baton migrate` is `baton migrate up`")
	for _, set := range []struct {
		name string
		invs []invocation
	}{
		{"deploy/kubernetes", kubernetesInvocations(t, "kubernetes")},
		{"deploy/systemd", systemdInvocations(t, "systemd")},
	} {
		var ran []string
		for _, inv := range set.invs {
			require.Empty(t, check(inv, flags))
			ran = append(ran, strings.Join(inv.args[:min(3, len(inv.args))], " "))
		}
		for _, want := range []string{"migrate", "api", "relay", "worker --agent openai", "group run audit", "group run webhook"} {
			require.Contains(t, ran, want, "%s runs baton %s", set.name, want)
		}
	}
}

// TestTheCheckFailsOnAVariableOrFlagTheBinaryDoesNotRead changes one name
// at a time in a copy of the deployment files and expects the check to
// name it.
func TestTheCheckFailsOnAVariableOrFlagTheBinaryDoesNotRead(t *testing.T) {
	t.Parallel()
	flags := cli.Flags()
	for _, tc := range []struct {
		file, from, to, want string
	}{
		{"systemd/env/api.env", "BATON_HTTP_ADDR=", "BATON_HTTP_ADDRESS=", "env/api.env: `baton api` reads no variable BATON_HTTP_ADDRESS"},
		{"systemd/baton-worker.service", "BATON_MODEL_API_KEY_FILE=", "BATON_MODEL_KEY_FILE=", "baton-worker.service: `baton worker` reads no variable BATON_MODEL_KEY_FILE"},
		{"systemd/baton-worker.service", "baton worker --agent openai\n", "baton worker --agnet openai\n", "baton-worker.service: `baton worker` has no flag --agnet"},
		{"systemd/env/group.env", "BATON_NATS_TLS_CA=", "BATON_NATS_CA=", "`baton group run` reads no variable BATON_NATS_CA"},
		{"kubernetes/relay.yaml", "name: BATON_REPLICAS", "name: BATON_STREAM_REPLICAS", "`baton relay` reads no variable BATON_STREAM_REPLICAS"},
		{"kubernetes/api.yaml", "name: BATON_DATABASE_URL_FILE", "name: BATON_DB_URL_FILE", "`baton api` reads no variable BATON_DB_URL_FILE"},
		{"kubernetes/migrate.yaml", `args: ["migrate"]`, `args: ["migrations"]`, "`baton migrations` is no command of the binary"},
	} {
		dir := t.TempDir()
		for _, sub := range []string{"kubernetes", "systemd"} {
			require.NoError(t, os.CopyFS(filepath.Join(dir, sub), os.DirFS(sub)))
		}
		path := filepath.Join(dir, tc.file)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Contains(t, string(b), tc.from, "%s holds %q", tc.file, tc.from)
		require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), tc.from, tc.to, 1)), 0o644))

		invs := append(kubernetesInvocations(t, filepath.Join(dir, "kubernetes")), systemdInvocations(t, filepath.Join(dir, "systemd"))...)
		var found []string
		for _, inv := range invs {
			for _, err := range check(inv, flags) {
				found = append(found, err.Error())
			}
		}
		require.NotEmpty(t, found, "%s with %q in place of %q passes the check", tc.file, tc.to, tc.from)
		for _, f := range found {
			require.Contains(t, f, tc.want, "the check names what changed, and nothing else")
		}
	}
}

// TestSystemdUnitsAreHardenedAndTakeSecretsAsCredentials: each unit runs
// as a user of its own with no way to gain privileges, a read-only system,
// no homes and a private /tmp, restarts after a failure (the migration
// runs once), and gets each secret as a credential that its BATON_*_FILE
// variable (or the seed's path) names; no environment file holds a
// secret.
func TestSystemdUnitsAreHardenedAndTakeSecretsAsCredentials(t *testing.T) {
	t.Parallel()
	envFiles, err := filepath.Glob("systemd/env/*.env")
	require.NoError(t, err)
	require.NotEmpty(t, envFiles)
	for _, f := range envFiles {
		for k, v := range envFile(t, f) {
			require.NotContains(t, secretVariables, k, "%s holds a secret: give it as a credential and %s_FILE", f, k)
			if k == "BATON_NATS_URL" {
				require.NotContains(t, v, "@", "%s: a NATS URL with a password is a secret: give it as a credential and BATON_NATS_URL_FILE", f)
			}
		}
	}
	for _, u := range systemdUnits(t, "systemd") {
		one := func(key string) string {
			v := u.All(key)
			require.Len(t, v, 1, "%s sets %s once", u.Name, key)
			return v[0]
		}
		require.Equal(t, "yes", one("DynamicUser"), u.Name)
		require.True(t, strings.HasPrefix(one("User"), "baton-"), u.Name)
		require.Equal(t, "yes", one("NoNewPrivileges"), u.Name)
		require.Equal(t, "strict", one("ProtectSystem"), u.Name)
		require.Equal(t, "yes", one("ProtectHome"), u.Name)
		require.Equal(t, "yes", one("PrivateTmp"), u.Name)
		require.Equal(t, "", one("CapabilityBoundingSet"), "%s has no capability", u.Name)
		if one("Type") == "oneshot" {
			require.Empty(t, u.All("Restart"), u.Name)
		} else {
			require.Equal(t, "on-failure", one("Restart"), u.Name)
			require.NotEmpty(t, one("RestartSec"), u.Name)
		}
		credentials := map[string]bool{}
		for _, c := range u.All("LoadCredential") {
			id, source, ok := strings.Cut(c, ":")
			require.True(t, ok, "%s: LoadCredential=%s names a file", u.Name, c)
			require.True(t, strings.HasPrefix(source, "/etc/baton/credentials/"), "%s: credentials live in /etc/baton/credentials", u.Name)
			credentials[id] = true
		}
		var files []string
		for _, e := range u.All("Environment") {
			k, v, _ := strings.Cut(e, "=")
			require.NotContains(t, secretVariables, k, "%s sets a secret as a value", u.Name)
			if strings.HasSuffix(k, "_FILE") || k == "BATON_NATS_NKEY_SEED" {
				require.True(t, strings.HasPrefix(v, "%d/"), "%s: %s names a credential (%%d/<id>)", u.Name, k)
				require.True(t, credentials[strings.TrimPrefix(v, "%d/")], "%s: %s names credential %s, which the unit loads", u.Name, k, v)
				files = append(files, k)
			}
		}
		require.Contains(t, files, "BATON_DATABASE_URL_FILE", u.Name)
		require.Len(t, files, len(credentials), "%s: every credential it loads is named by a variable", u.Name)
	}
}
