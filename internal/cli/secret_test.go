package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// TestSecretsComeFromFilesAndNeverShow: a secret setting can come from the
// file its <VAR>_FILE names (here the database URL, with a password, of a
// database that refuses it: the error must name the host, never the
// password); both the variable and its _FILE is refused; a secret on the
// command line is accepted but warned about, without showing it.
func TestSecretsComeFromFilesAndNeverShow(t *testing.T) {
	// Not parallel: it sets process environment variables.
	dir := t.TempDir()
	const password = "s3cret-db-pass"
	url := "postgres://baton:" + password + "@127.0.0.1:1/baton"
	file := filepath.Join(dir, "database-url")
	require.NoError(t, os.WriteFile(file, []byte(url+"\n"), 0o600))

	t.Setenv("BATON_DATABASE_URL_FILE", file)
	_, stderr, code := run(t, "token", "list", "--user", "x")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "127.0.0.1:1", "the URL came from the file: the error names its host")
	require.NotContains(t, stderr, password)

	t.Setenv("BATON_DATABASE_URL", url)
	_, stderr, code = run(t, "token", "list", "--user", "x")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "BATON_DATABASE_URL and BATON_DATABASE_URL_FILE are both set")
	require.NotContains(t, stderr, password)
	os.Unsetenv("BATON_DATABASE_URL")

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	t.Setenv("BATON_DATABASE_URL_FILE", empty)
	_, stderr, code = run(t, "token", "list", "--user", "x")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "is empty")
	os.Unsetenv("BATON_DATABASE_URL_FILE")

	db := testenv.Database(t)
	_, stderr, _ = run(t, "token", "list", "--user", "nobody", "--database-url", db.URL)
	require.NotContains(t, stderr, "process list", "a URL without a password is no secret: %s", stderr)
	for _, args := range [][]string{
		{"token", "list", "--user", "x", "--database-url=" + url},
		{"token", "list", "--user", "x", "--database-url", url},
	} {
		_, stderr, _ = run(t, args...)
		require.Contains(t, stderr, "process list", "%v", args)
		require.Contains(t, stderr, "BATON_DATABASE_URL_FILE")
		require.NotContains(t, stderr, password, "the warning never shows the secret")
	}
}
