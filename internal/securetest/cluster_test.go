package securetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	natsdeploy "github.com/batonhq/baton/deploy/nats"
	"github.com/batonhq/baton/deploy/nats/clustertest"
	"github.com/batonhq/baton/internal/natsconn"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// TestEveryComponentWorksOnTheSecuredClusterWithItsOwnUser starts the
// three-node cluster from the shipped deploy/nats files and runs each
// component as a real process with its own nkey user, exactly as
// deploy/nats/README.md tells an operator: the seed file, the CA and the
// three nodes' tls:// URLs in BATON_NATS_* variables. A message posted
// through the API gets the echo agent's reply, the audit group records it,
// a replay of the audit group with the replay user's credentials applies
// nothing twice, and baton status, as the read-only status user, finds
// nothing to attend to. No component is refused anything on the way. On
// the same cluster, a worker without its seed, or without the CA, exits
// with an error that says what to fix. Nothing any process prints holds a
// seed or the API token.
func TestEveryComponentWorksOnTheSecuredClusterWithItsOwnUser(t *testing.T) {
	t.Parallel()
	step := timeline(t)
	testenv.StartPlainBatonBuild()
	c := clustertest.Start(t, clustertest.Options{})
	step("the cluster runs")
	db := testenv.Database(t)
	ps := newProcesses(t)
	step("the database and the binary are ready")
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Second)
	defer cancel()

	// What an operator puts in a component's environment; the inbox
	// prefix is left to its default, _INBOX_<component>, except where a
	// component below sets it.
	env := func(user string, extra ...string) []string {
		return append([]string{
			"BATON_DATABASE_URL=" + db.URL,
			"BATON_NATS_URL=" + c.TLSURLs,
			"BATON_NATS_NKEY_SEED=" + c.SeedFile(user),
			"BATON_NATS_TLS_CA=" + c.CAFile(),
			"BATON_LOG_FORMAT=json",
		}, extra...)
	}
	// The relay owns the outbox stream and sets its replicas; the api owns
	// the events stream and sets its own. The worker and the group read
	// the outbox stream as it is.
	ps.start(t, "relay", env("relay"), "relay", "--replicas", "3")
	ps.start(t, "worker", env("worker"), "worker")
	ps.start(t, "group audit", env("group-audit", "BATON_NATS_INBOX_PREFIX=_INBOX_audit"), "group", "run", "audit")
	api := ps.start(t, "api", env("api", "BATON_REPLICAS=3", "BATON_HTTP_ADDR=127.0.0.1:0"), "api")

	// The test watches the cluster as an operator's monitoring would: as
	// the read-only status user.
	js := connect(t, c.Options("status"))
	waitForStream(ctx, t, js, batonnats.DefaultStream, 3)
	waitForStream(ctx, t, js, batonnats.DefaultEventsStream, 3)
	waitForConsumer(ctx, t, js, batonnats.DefaultStream, batonnats.DefaultConsumer)
	waitForConsumer(ctx, t, js, batonnats.DefaultStream, "audit")
	step("the streams and durables exist")

	var served struct{ Addr string }
	require.NoError(t, json.Unmarshal([]byte(api.WaitLine(t, 30*time.Second, `"serving HTTP API"`)), &served))
	tokenRun, code := ps.run(t, "token create", 30*time.Second, []string{"BATON_DATABASE_URL=" + db.URL}, "token", "create", "--user", "alice")
	require.Zero(t, code, "baton token create failed:\n%s", tokenRun.Tail(10))
	lines := strings.Split(strings.TrimSpace(tokenRun.Text("stdout")), "\n")
	token := lines[len(lines)-1]

	newAPIClient(served.Addr, token).converse(t, "secured", "hello over TLS", 30*time.Second)
	step("the reply came")

	// The audit group records every event of the stream, once: the
	// message's insert, and an announcement of it when the relay's slot
	// was created after the message was stored.
	counts := func() (rows, distinct, inbox int) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), (SELECT count(*) FROM group_inbox WHERE group_name = 'audit') FROM audit_events`).Scan(&rows, &distinct, &inbox))
		return rows, distinct, inbox
	}
	var events int
	eventually(t, 30*time.Second, func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err := js.Stream(rctx, batonnats.DefaultStream)
		if err != nil {
			return false, fmt.Sprintf("the outbox stream's message count (%v)", err)
		}
		events = int(info.CachedInfo().State.Msgs)
		rows, _, _ := counts()
		return events > 0 && rows == events, fmt.Sprintf("an audit row for each of the %d events of the stream (%d rows)", events, rows)
	})

	step("the audit group recorded every event")

	// The replay user replays the audit group from the stream's start:
	// the events come again and the group's inbox skips them.
	replay, code := ps.run(t, "replay", 45*time.Second, env("replay", "BATON_NATS_INBOX_PREFIX=_INBOX_replay"), "replay", "--group", "audit", "--all")
	require.Zero(t, code, "baton replay --group audit --all failed:\n%s", replay.Tail(20))
	require.Contains(t, replay.Text("stdout"), fmt.Sprintf("replayed group audit: %d events", events))
	rows, distinct, inbox := counts()
	require.Equal(t, [3]int{events, events, events}, [3]int{rows, distinct, inbox}, "the replay must apply nothing twice: audit rows, their distinct events and the group's inbox, one per event")

	step("the replay applied nothing twice")

	// The read-only status user sees the whole system, and it is well.
	for _, args := range [][]string{{"status"}, {"status", "--json"}} {
		status, code := ps.run(t, "baton "+strings.Join(args, " "), 30*time.Second, env("status"), args...)
		require.Zero(t, code, "baton %s should find the system well and say so:\n%s", strings.Join(args, " "), status.Tail(40))
	}
	step("baton status found nothing to attend to")

	// Refusals on the same cluster: the cluster is up and the other
	// components work, so only the missing setting is to blame.
	without := func(drop string, e []string) []string {
		var out []string
		for _, kv := range e {
			if !strings.HasPrefix(kv, drop+"=") {
				out = append(out, kv)
			}
		}
		return out
	}
	noSeed, code := ps.run(t, "worker without its seed", 30*time.Second, without("BATON_NATS_NKEY_SEED", env("worker")), "worker")
	require.NotZero(t, code, "a worker without credentials must not start:\n%s", noSeed.Tail(10))
	msg := noSeed.WaitLine(t, time.Second, "baton:", "Authorization Violation")
	require.Contains(t, msg, "gave none: set --nats-nkey-seed / BATON_NATS_NKEY_SEED", "the error should say that the worker gave no credentials, and where they go")

	noCA, code := ps.run(t, "worker without the CA", 30*time.Second, without("BATON_NATS_TLS_CA", env("worker")), "worker")
	require.NotZero(t, code, "a worker that does not trust the cluster's CA must not start:\n%s", noCA.Tail(10))
	msg = noCA.WaitLine(t, time.Second, "baton:", "certificate")
	require.Contains(t, msg, "BATON_NATS_TLS_CA", "the error should name the setting of the CA")

	step("the refusals were explained")
	ps.stopAll()
	step("every process stopped")
	ps.requireNoLine(t, "no component may be refused what its code uses (deploy/nats/accounts.conf)", "permissions violation")
	ps.requireNoLine(t, "no component may be refused what its code uses (deploy/nats/accounts.conf)", "refused an operation")

	var secrets []secret
	for _, u := range natsdeploy.Users {
		secrets = append(secrets, fileSecret(t, "nkey seed of "+u.Name, c.SeedFile(u.Name)))
	}
	secrets = append(secrets, secret{Name: "API token", Value: token})
	ps.requireNoSecret(t, secrets, func(p *process, l outputLine, s secret) bool {
		// The one place a token is shown: when it is made.
		return p == tokenRun && l.Stream == "stdout" && s.Value == token
	})
}

// connect connects to NATS as o says, for the test's own observations;
// the connection closes when t ends.
func connect(t *testing.T, o natsconn.Options) jetstream.JetStream {
	t.Helper()
	nc, err := natsconn.Connect(o)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// waitForStream waits until stream exists with replicas replicas and a
// leader.
func waitForStream(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string, replicas int) {
	t.Helper()
	eventually(t, 30*time.Second, func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := js.Stream(rctx, stream)
		if err != nil {
			return false, fmt.Sprintf("stream %s (%v)", stream, err)
		}
		info := s.CachedInfo()
		ok := info.Config.Replicas == replicas && info.Cluster != nil && info.Cluster.Leader != ""
		return ok, fmt.Sprintf("stream %s with %d replicas and a leader (has %d)", stream, replicas, info.Config.Replicas)
	})
}

// waitForConsumer waits until the durable consumer exists.
func waitForConsumer(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, durable string) {
	t.Helper()
	eventually(t, 30*time.Second, func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Consumer(rctx, stream, durable)
		return err == nil, fmt.Sprintf("durable %s on %s (last answer: %v)", durable, stream, err)
	})
}
