package cli_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
)

// service is one long-running subcommand run in this process until the
// test stops it.
type service struct {
	name   string
	cancel context.CancelFunc
	done   chan error
	stderr *testenv.SyncBuffer
}

func runService(t *testing.T, name string, args ...string) *service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{name: name, cancel: cancel, done: make(chan error, 1), stderr: &testenv.SyncBuffer{}}
	go func() {
		s.done <- cli.Run(ctx, append([]string{"--log-format", "json"}, args...), &testenv.SyncBuffer{}, s.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop within 30s", name)
		}
	})
	return s
}

// running fails t when the service has returned.
func (s *service) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		t.Fatalf("%s exited (%v) while it should ride the outage out:\n%s", s.name, err, s.stderr.String())
	default:
	}
}

// TestEveryServiceStartsWhileDatabaseAndNATSAreAwayAndServesOnceTheyAreBack:
// the relay, a worker, the API and a group start while neither
// PostgreSQL nor NATS can be reached: none exits; each says it waits;
// the API's /readyz answers 503. Once both are back, without any restart,
// a message posted through the API is answered, the audit group records
// it, /readyz answers 200, and each stops cleanly.
func TestEveryServiceStartsWhileDatabaseAndNATSAreAwayAndServesOnceTheyAreBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// PostgreSQL runs as the postgres user when the tests run as root: it
	// must reach its folder, which t.TempDir's parent does not let it.
	dir, err := os.MkdirTemp("", "baton-rideout-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	pg, err := pgcluster.New(pgcluster.Options{Dir: filepath.Join(dir, "pg"), Settings: map[string]string{"wal_level": "logical"}})
	require.NoError(t, err)
	require.NoError(t, pg.Init(ctx))
	require.NoError(t, pg.Start(ctx))
	t.Cleanup(func() { _ = pg.Stop(pgcluster.Immediate) })
	dbURL := pg.URL("postgres")
	_, errOut, code := run(t, "migrate", "--database-url", dbURL)
	require.Zero(t, code, errOut)
	out, errOut, code := run(t, "token", "create", "--database-url", dbURL, "--user", "rider")
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	require.NoError(t, pg.Stop(pgcluster.Fast))

	n := testenv.StartNATS(t)
	n.Stop()
	httpPort, err := pgcluster.FreePort()
	require.NoError(t, err)
	api := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	common := []string{"--database-url", dbURL, "--nats-url", n.URL}
	services := []*service{
		runService(t, "relay", append([]string{"relay", "--heartbeat", "200ms", "--sweep-interval", "1s", "--sweep-age", "2s"}, common...)...),
		runService(t, "worker", append([]string{"worker", "--debounce", "0"}, common...)...),
		runService(t, "api", append([]string{"api", "--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort)}, common...)...),
		runService(t, "group", append([]string{"group", "run", "audit"}, common...)...),
	}
	for _, s := range services {
		require.Eventually(t, func() bool {
			s.running(t)
			return strings.Contains(s.stderr.String(), "cannot reach")
		}, 30*time.Second, 50*time.Millisecond, "%s says it waits for what it cannot reach", s.name)
	}
	ready := func() int {
		resp, err := http.Get(api + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return ready() == http.StatusServiceUnavailable }, 30*time.Second, 50*time.Millisecond,
		"the API serves and reports itself not ready while the database is away")

	require.NoError(t, pg.Start(ctx))
	n.Start()
	require.Eventually(t, func() bool { return ready() == http.StatusOK }, 30*time.Second, 50*time.Millisecond, "the API is ready once the database is back")
	do := func(method, path, body string) int {
		req, err := http.NewRequest(method, api+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusCreated, do(http.MethodPost, "/v1/conversations", `{"id": "c"}`))
	require.Equal(t, http.StatusAccepted, do(http.MethodPost, "/v1/conversations/c/messages", `{"id": "m1", "content": "hello"}`))
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer db.Close()
	require.Eventually(t, func() bool {
		var replies, audited int
		if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM messages WHERE role = 'assistant'), (SELECT count(*) FROM audit_events)`).Scan(&replies, &audited); err != nil {
			return false
		}
		return replies == 1 && audited >= 1
	}, 60*time.Second, 100*time.Millisecond, "the message is answered and audited once everything is back, with no process restarted")
	for _, s := range services {
		s.running(t)
		s.cancel()
		require.NoError(t, <-s.done, "%s stops cleanly:\n%s", s.name, s.stderr.String())
		s.done <- nil
	}
}
