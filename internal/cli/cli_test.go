package cli_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// run calls the CLI the way main does and returns stdout, stderr and the
// exit code.
func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := cli.Run(context.Background(), append([]string{"--log-format", "json"}, args...), &out, &errb)
	if err != nil {
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), cli.ExitCode(err)
}

func TestMigrateTwiceIsNoOpAndStatusListsApplied(t *testing.T) {
	t.Parallel()
	url := testenv.EmptyDatabase(t)
	out, stderr, code := run(t, "migrate", "--database-url", url)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "applied")

	out, stderr, code = run(t, "migrate", "--database-url", url)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "up to date")

	out, stderr, code = run(t, "migrate", "status", "--database-url", url)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "applied")
	require.NotContains(t, out, "pending")
}

func TestConcurrentMigrateRunsDoNotFail(t *testing.T) {
	t.Parallel()
	url := testenv.EmptyDatabase(t)
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, codes[i] = run(t, "migrate", "--database-url", url)
		}()
	}
	wg.Wait()
	require.Equal(t, []int{0, 0, 0}, codes)
}

func TestTokenCreatePrintsTokenAsLastLine(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	out, stderr, code := run(t, "token", "create", "--user", "alice", "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(token, "baton_"), "last line is the token: %q", out)
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE u.name = 'alice' AND t.token_hash = sha256($1::bytea)`,
		[]byte(token)).Scan(&n))
	require.Equal(t, 1, n, "only the token's hash is stored")
	var plain int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM api_tokens WHERE position($1::bytea in token_hash) > 0`, []byte(token)).Scan(&plain))
	require.Zero(t, plain)
}

func TestMissingDatabaseURLIsUsageError(t *testing.T) {
	t.Setenv("BATON_DATABASE_URL", "")
	_, stderr, code := run(t, "migrate")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "BATON_DATABASE_URL")
}

func TestUnreachableDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	_, stderr, code := run(t, "migrate", "--database-url", "postgres://postgres@"+addr+"/x?connect_timeout=2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "cannot reach PostgreSQL")
}

func TestAPIOnBusyPortNamesTheFlag(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	_, stderr, code := run(t, "api", "--database-url", db.URL, "--http-addr", l.Addr().String())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "already in use")
	require.Contains(t, stderr, "--http-addr")
}

func TestBadFlagIsUsageError(t *testing.T) {
	t.Parallel()
	_, stderr, code := run(t, "api", "--http-addr", "nonsense", "--database-url", "postgres://x@127.0.0.1/x")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--http-addr")

	_, _, code = run(t, "no-such-command")
	require.Equal(t, 2, code)
}

func TestVersionAndHelp(t *testing.T) {
	t.Parallel()
	out, _, code := run(t, "version")
	require.Equal(t, 0, code)
	require.Contains(t, out, "baton")
	out, _, code = run(t, "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "relay")
}
