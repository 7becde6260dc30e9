package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestDevWritesItsURLsSoThatStatusAndTokenCreateWorkAfterOneSource(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	for p := filepath.Dir(dir); p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o755)
	}
	bin := testenv.BatonBinary(t)
	httpPort, pgPort, natsPort := freePort(t), freePort(t), freePort(t)
	_, stdout, stop := startDev(t, dir, httpPort, pgPort, natsPort)

	envFile := filepath.Join(dir, "dev.env")
	b, err := os.ReadFile(envFile)
	require.NoError(t, err, "baton dev writes %s", envFile)
	env := string(b)
	require.Contains(t, env, "export BATON_DATABASE_URL='postgres://postgres@127.0.0.1:")
	require.Contains(t, env, "BATON_NATS_URL='nats://127.0.0.1:")
	require.NotContains(t, env, "password")
	for _, want := range []string{"database: postgres://postgres@127.0.0.1:", "NATS:     nats://127.0.0.1:", "source " + envFile} {
		require.Contains(t, stdout.String(), want, "baton dev prints where it runs")
	}

	// Another terminal: one source, then the commands that need the URLs.
	shell := func(command string) (string, int) {
		cmd := exec.Command("bash", "-c", "source "+envFile+" && "+command)
		cmd.Env = append(os.Environ(), "BATON_DATABASE_URL=", "BATON_NATS_URL=", "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return string(out), code
	}
	out, code := shell("baton status --json --log-format json")
	require.Equal(t, 0, code, "baton status after sourcing dev.env:\n%s", out)
	require.Contains(t, out, `"exists": true`, "status found the dev slot")
	require.NotContains(t, out, "NATS is not reachable")
	out, code = shell("baton token create --user second --log-format json")
	require.Equal(t, 0, code, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.True(t, strings.HasPrefix(lines[len(lines)-1], "baton_"), "the token is the last line: %s", out)
	require.NoError(t, stop())
}
