package consumer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/migrations"
)

// networkedSetup is setup on a PostgreSQL and a NATS server that processes
// in the network's namespaces reach on its host address. The server ends
// a connection whose client stopped answering after about three seconds
// of silence (TCP keepalives), where a production server is set to about
// eleven (deploy/postgres/baton.conf): the test waits for it.
func networkedSetup(t *testing.T, net *netns.Network) (b *bundle, pgPort int) {
	t.Helper()
	ctx := context.Background()
	// PostgreSQL runs as the postgres user when the tests run as root: it
	// must reach its folder, which t.TempDir's parent does not let it.
	dir, err := os.MkdirTemp("", "baton-cutoff-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	pg, err := pgcluster.New(pgcluster.Options{
		Dir: filepath.Join(dir, "pg"),
		Settings: map[string]string{
			"wal_level":               "logical",
			"listen_addresses":        "127.0.0.1," + net.HostIP(),
			"tcp_keepalives_idle":     "1",
			"tcp_keepalives_interval": "1",
			"tcp_keepalives_count":    "2",
		},
		HBA: []string{"host all postgres " + net.CIDR() + " trust"},
	})
	require.NoError(t, err)
	require.NoError(t, pg.Init(ctx))
	require.NoError(t, pg.Start(ctx))
	t.Cleanup(func() { _ = pg.Stop(pgcluster.Immediate) })
	admin, err := pgxpool.New(ctx, pg.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE baton")
	admin.Close()
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, pg.URL("baton"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	db := &testenv.DB{Name: "baton", URL: pg.URL("baton"), Pool: pool}
	return &bundle{Bundle: outboxtest.SetupOn(t, db, testenv.StartNATSOn(t, net.HostIP()))}, pg.Port()
}

// countLines counts the lines of p's output that contain s.
func countLines(p *proctest.Process, s string) int {
	n := 0
	for _, l := range p.Output() {
		if strings.Contains(l.Text, s) {
			n++
		}
	}
	return n
}

// TestACutOffWorkerWritesNothingAfterATakeoverEvenWhenItsLinkComesBackMidFinalize:
// worker A, a real `baton worker` in a network namespace of its own with
// default settings, answers a message and is held (a pause point stops
// the process) at its finalize, where it has passed every check of its
// own. Its link to PostgreSQL is cut: the server finds its connections
// dead (TCP keepalives), its session's lock goes, and worker B, in the
// harness's namespace, takes the conversation over and answers the first
// message together with a second one. Then A's link comes back and A goes
// on with its finalize, whose statement reaches the database on a fresh
// connection: fencing refuses it, and A writes nothing at all: no reply,
// no operation, no change to the outbox rows, the conversation or its
// run. B's turn is the one answer.
func TestACutOffWorkerWritesNothingAfterATakeoverEvenWhenItsLinkComesBackMidFinalize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	net, err := netns.New()
	require.NoError(t, err, "this test runs a worker in a network namespace of its own and cuts its link")
	t.Cleanup(net.Close)
	node, err := net.Add("worker-a")
	require.NoError(t, err)
	b, pgPort := networkedSetup(t, net)
	b.trustSessions(t)
	bin := testenv.BatonBinary(t)
	var g proctest.Group
	t.Cleanup(func() { g.StopAll(5 * time.Second) })
	args := func(dbURL string) []string {
		return []string{"worker", "--database-url", dbURL, "--nats-url", b.NATS.URL,
			"--stream", b.Stream.Name, "--subject-prefix", b.Stream.SubjectPrefix,
			"--partitions", strconv.Itoa(b.Stream.Partitions), "--log-format", "json"}
	}

	// A alone, so that it takes the first message.
	aURL := strings.Replace(b.DB.URL, "127.0.0.1:", net.HostIP()+":", 1)
	bin0, args0 := node.Command(bin, args(aURL)...)
	cmdA := exec.Command(bin0, args0...)
	cmdA.Env = append(os.Environ(), PauseEnv+"="+CrashBeforeFinalize)
	a, err := g.Start("worker-a", cmdA, proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Cmd.Process.Signal(syscall.SIGCONT) })
	a.WaitLine(t, 60*time.Second, "worker session held")

	conv := b.Conversation("c")
	m1 := b.Send("c", "m1", "first")
	a.WaitLine(t, 30*time.Second, "pause point "+CrashBeforeFinalize+" reached")
	var runA string
	require.NoError(t, b.DB.Pool.QueryRow(ctx, `SELECT id FROM agent_runs WHERE conversation_id = $1 AND status = 'running'`, conv).Scan(&runA))

	// A's link to PostgreSQL is cut, both ways; NATS is left alone.
	require.NoError(t, node.Filter(netns.CutFrom([]string{net.HostIP()}, pgPort)...))
	m2 := b.Send("c", "m2", "second")
	workerB, err := g.Start("worker-b", exec.Command(bin, args(b.DB.URL)...), proctest.Options{})
	require.NoError(t, err)
	workerB.WaitLine(t, 60*time.Second, "worker session held")

	// B takes over once the server has ended A's connections: A's run is
	// recovered because its session ended, not because its 30 s lease
	// expired, and B answers both messages in one turn, well within the
	// 30 s ack wait: A, without its session, hands the triggers of the
	// conversation back instead of keeping them behind its held turn.
	var runB string
	b.Eventually(20*time.Second, func() bool {
		err := b.DB.Pool.QueryRow(ctx, `SELECT id FROM agent_runs WHERE conversation_id = $1 AND status = 'finalized'
			AND outbox_ids @> ARRAY[$2::bigint, $3::bigint]`, conv, m1, m2).Scan(&runB)
		return err == nil
	}, "worker B answers both messages within 20s of the cut, once A's connections are found dead (3s)")
	var status, reason string
	require.NoError(t, b.DB.Pool.QueryRow(ctx, `SELECT status, error FROM agent_runs WHERE id = $1`, runA).Scan(&status, &reason))
	require.Equal(t, "recovered", status, "A's run is recovered by the takeover")
	require.Contains(t, reason, "session", "A's run is taken over because its session ended, not after the lease: %s", reason)

	before := snapshotConversation(t, b, conv)

	// A's link comes back while A is at its finalize: A takes its
	// session again, and its finalize goes on.
	require.NoError(t, node.Filter())
	b.Eventually(30*time.Second, func() bool { return countLines(a, "worker session held") == 2 }, "worker A holds its session again once its link is back")
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGCONT))
	line := a.WaitLine(t, 60*time.Second, "turn abandoned")
	require.Contains(t, line, runA, "A's finalize reached the database and the fence refused it: %s", line)
	// A's trigger comes back to it and finds nothing left to do.
	b.ConsumerSettled(DefaultConsumerName, 60*time.Second)

	require.Equal(t, before, snapshotConversation(t, b, conv), "the cut-off worker wrote nothing after the takeover")
	require.Zero(t, b.Count(`SELECT count(*) FROM messages WHERE run_id = $1`, runA), "no reply or error message of A's run")
	require.Zero(t, b.Count(`SELECT count(*) FROM operations WHERE run_id = $1`, runA), "no operation of A's run")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE conversation_id = $1 AND role <> 'user'`, conv), "one answer in the conversation")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE conversation_id = $1 AND role = 'assistant' AND run_id = $2`, conv, runB),
		"the one answer is B's turn")
	require.True(t, a.Cmd.ProcessState == nil, "A is still running")
}

// snapshotConversation is everything a run could write about conv: its
// messages, outbox rows, operations, runs and the conversation row, as
// text.
func snapshotConversation(t *testing.T, b *bundle, conv string) string {
	t.Helper()
	var out strings.Builder
	for _, q := range []string{
		`SELECT id, role, content, run_id, turn_id FROM messages WHERE conversation_id = $1 ORDER BY id`,
		`SELECT id, status, run_id, attempts, processed_at FROM agent_outbox WHERE conversation_id = $1 ORDER BY id`,
		`SELECT id, run_id, tool, status, message_id FROM operations WHERE conversation_id = $1 ORDER BY id`,
		`SELECT id, status, error, reply_message_id, finished_at, lease_expires_at FROM agent_runs WHERE conversation_id = $1 ORDER BY id`,
		`SELECT run_id, lease_expires_at, updated_at, last_message_at, unread_count FROM conversations WHERE id = $1`,
	} {
		rows, err := b.DB.Pool.Query(context.Background(), q, conv)
		require.NoError(t, err, q)
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			fmt.Fprintln(&out, vals...)
		}
		require.NoError(t, rows.Err())
	}
	return out.String()
}
