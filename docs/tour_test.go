package docs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
)

// tourBlock is a shell block of the README's tour.
type tourBlock struct {
	line int // of its opening fence
	code string
	// until, when set, is text the block's output must hold: the block
	// runs again until it does, as a reader runs it again "a moment
	// later".
	until string
}

var tourMarker = regexp.MustCompile(`^<!-- tour(?:: until "([^"]*)")? -->$`)

// tourBlocks reads the blocks marked for the tour: a line
// `<!-- tour -->` or `<!-- tour: until "text" -->` right before a ```sh
// fence.
func tourBlocks(t *testing.T, readme string) []tourBlock {
	t.Helper()
	var blocks []tourBlock
	lines := strings.Split(readme, "\n")
	for i := 0; i < len(lines); i++ {
		m := tourMarker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		require.Less(t, i+1, len(lines), "README.md:%d: a tour marker with no block after it", i+1)
		require.Equal(t, "```sh", strings.TrimSpace(lines[i+1]), "README.md:%d: a tour marker must be followed at once by a ```sh block", i+1)
		b := tourBlock{line: i + 2, until: m[1]}
		var code []string
		for i += 2; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			code = append(code, lines[i])
		}
		b.code = strings.Join(code, "\n")
		blocks = append(blocks, b)
	}
	return blocks
}

// tourScript runs the blocks in one shell, in order, so that what one
// sets (TOKEN, API) the next uses. A block with until text runs again,
// for at most untilTimeout, until its output holds the text.
func tourScript(blocks []tourBlock, untilTimeout time.Duration) string {
	var b strings.Builder
	b.WriteString("set -eo pipefail\n")
	for i, blk := range blocks {
		fmt.Fprintf(&b, "echo \"### block %d (README.md:%d) at ${SECONDS}s\"\n", i+1, blk.line)
		if blk.until == "" {
			b.WriteString(blk.code + "\n")
			continue
		}
		fmt.Fprintf(&b, `deadline=$((SECONDS+%d))
while :; do
  out=$( { %s
} 2>&1 ) || true
  if [[ "$out" == *%s* ]]; then printf '%%s\n' "$out"; break; fi
  if (( SECONDS > deadline )); then printf '%%s\n' "$out"; echo 'TOUR: the output never held %s'; exit 1; fi
  sleep 0.2
done
`, int(untilTimeout.Seconds()), blk.code, strconv.Quote(blk.until), strings.ReplaceAll(blk.until, "'", ""))
	}
	b.WriteString("echo \"### tour done at ${SECONDS}s\"\n")
	return b.String()
}

// TestTheReadmeTourRunsAsWritten runs the shell blocks of the README's
// tour, as written, against `baton dev` started as `make dev` starts it:
// with its default ports and folder. Both run in a network namespace of
// their own, so the ports the README names are free whatever else runs
// on the machine.
func TestTheReadmeTourRunsAsWritten(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("the tour runs baton dev in a network namespace of its own, so that the README's ports (8080, 54329, 4222) are free: run the tests as root")
	}
	for _, tool := range []string{"curl", "ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s: run scripts/install-deps.sh tour (make test does)", tool)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	require.NoError(t, err)
	blocks := tourBlocks(t, string(readme))
	require.NotEmpty(t, blocks, "README.md marks no block for the tour (<!-- tour --> before a ```sh block)")

	bin := testenv.PlainBatonBinary(t)
	dir, err := os.MkdirTemp("", "baton-tour-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The local cluster runs as the postgres user, who must reach it.
	require.NoError(t, os.Chmod(dir, 0o755))

	// baton dev in a network namespace of its own, on its defaults, as
	// `make dev` runs it from the repository's folder.
	cmd := exec.Command("bash", "-c", `ip link set lo up && exec "$0" dev`, bin)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	dev, err := proctest.Start("baton dev", cmd, proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { dev.Kill() })
	dev.WaitLine(t, 2*time.Minute, "Baton is running")

	script := filepath.Join(dir, "tour.sh")
	require.NoError(t, os.WriteFile(script, []byte(tourScript(blocks, 45*time.Second)), 0o644))
	tour := exec.Command("nsenter", "--net=/proc/"+strconv.Itoa(dev.Cmd.Process.Pid)+"/ns/net", "bash", script)
	tour.Dir = dir
	tour.Env = cleanEnv()
	out, err := tour.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's tour failed (%v); expected every block to run and each checked block to print its text.\n--- tour\n%s\n--- baton dev, last lines\n%s", err, out, dev.Tail(30))
	}
	require.Contains(t, string(out), "### tour done", "the tour stopped before its end:\n%s", out)
	t.Logf("the tour:\n%s", out)

	// Ctrl-C stops every part cleanly.
	require.NoError(t, dev.Cmd.Process.Signal(os.Interrupt))
	require.NoError(t, dev.AwaitExit(time.Minute), "baton dev did not stop after Ctrl-C:\n%s", dev.Tail(20))
	require.Equal(t, 0, dev.ExitCode(), "baton dev should stop cleanly after Ctrl-C:\n%s", dev.Tail(20))
}

// cleanEnv is this process's environment without Baton's settings, so
// that the tour meets `baton dev` as a fresh shell would.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATON_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

func TestTheTourBlocksAreReadFromTheirMarkers(t *testing.T) {
	t.Parallel()
	readme := "intro\n<!-- tour -->\n```sh\nA=1\necho $A\n```\ntext\n<!-- tour: until \"x y\" -->\n```sh\necho x y\n```\n<!-- tour: the app joins here -->\n```sh\nnot this\n```\n"
	blocks := tourBlocks(t, readme)
	require.Equal(t, []tourBlock{{line: 3, code: "A=1\necho $A"}, {line: 9, code: "echo x y", until: "x y"}}, blocks)

	// The script keeps state from block to block and retries a block
	// until its text shows.
	counter := filepath.Join(t.TempDir(), "n")
	script := tourScript([]tourBlock{
		{code: "GREETING=hello"},
		{code: fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); echo $((n+1)) > %[1]s; echo "$GREETING $((n+1))"`, counter), until: "hello 3"},
	}, 10*time.Second)
	out, err := exec.Command("bash", "-c", script).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "hello 3\n### tour done at", "the second block should have run three times, with the first block's variable")

	failing := tourScript([]tourBlock{{code: "echo no", until: "yes"}}, 1*time.Second)
	out, err = exec.Command("bash", "-c", failing).CombinedOutput()
	require.Error(t, err, "a block whose text never shows must fail the tour: %s", out)
	require.Contains(t, string(out), "TOUR: the output never held yes")
}
