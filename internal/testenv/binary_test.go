package testenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// The plain binary is this tree's cmd/baton, copied into a folder of the
// package's own that every user can enter, for processes that run as an
// unprivileged user.
func TestPlainBatonBinaryRunsFromAFolderEveryUserCanEnter(t *testing.T) {
	t.Parallel()
	if os.Getenv("BATON_TEST_BINARY") != "" {
		t.Skip("BATON_TEST_BINARY names the binary")
	}
	bin := testenv.PlainBatonBinary(t)
	require.Equal(t, bin, testenv.PlainBatonBinary(t), "one binary per package")
	if prebuilt := os.Getenv("BATON_TEST_PLAIN_BINARY"); prebuilt != "" {
		require.NotEqual(t, prebuilt, bin, "the package runs a copy of the prebuilt binary")
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "baton dev\n", string(out))
	for _, p := range []string{bin, filepath.Dir(bin)} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o755), fi.Mode().Perm(), "%s: every user can enter the folder and run the binary", p)
	}
}
