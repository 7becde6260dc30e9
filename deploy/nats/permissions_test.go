package natsdeploy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/natsconn"
	batonnats "github.com/batonhq/baton/nats"
)

// The streams and subjects as Baton provisions them in production.
var (
	outboxStream = batonnats.StreamConfig{Replicas: 3}.WithDefaults()
	eventsStream = batonnats.EventsConfig{Replicas: 3}.WithDefaults()
)

// conversation holds characters that subjects forbid, as a client may
// choose them.
const conversation = "conv.1 *>"

// TestShippedClusterGivesEachComponentWhatItNeedsAndNoMore starts the
// cluster from the shipped files and connects as each component, through
// natsconn.Connect with the component's seed, the CA and its inbox
// prefix, the way the component does.
//
// The two cluster tests run one after the other: six raft nodes with the
// race detector on a small machine miss heartbeats and hold elections.
func TestShippedClusterGivesEachComponentWhatItNeedsAndNoMore(t *testing.T) {
	c := startCluster(t, ".")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, step := range []struct {
		name  string
		check func(context.Context, *cluster) error
	}{
		{"relay owns the outbox stream", checkRelayOwnsTheOutboxStream},
		{"api owns the events stream", checkAPIOwnsTheEventsStream},
		{"worker runs turns", checkWorkerRunsTurns},
		{"live deltas and events reach the api", checkLiveAndEventsReachTheAPI},
		{"stop notices and snapshot requests reach the worker", checkStopsAndSnapshotsReachTheWorker},
		{"group owns its durable", checkGroupOwnsItsDurable},
		{"replay resets a group", checkReplayResetsAGroup},
		{"status reads", checkStatusReads},
		{"console reads", checkConsoleReads},
		{"api cannot publish triggers", checkAPICannotPublishTriggers},
		{"worker cannot delete or change the streams", checkWorkerCannotChangeTheStreams},
		{"group cannot take another durable", checkGroupCannotTakeAnotherDurable},
		{"replay cannot take over durables", checkReplayCannotTakeOverDurables},
		{"status is read-only", checkStatusIsReadOnly},
		{"console is read-only", checkConsoleIsReadOnly},
		{"no component reads another's inbox", checkNoComponentReadsAnothersInbox},
		{"only known users with the CA connect", checkOnlyKnownUsersWithTheCAConnect},
		{"clients and routes use TLS, monitoring is local", checkTLSAndMonitoring},
	} {
		if !t.Run(step.name, func(t *testing.T) { require.NoError(t, step.check(ctx, c)) }) {
			// Later steps build on earlier ones.
			return
		}
	}
}

// TestMutatedAccountsFileFailsTheChecks changes two permission lines of
// the shipped accounts.conf in a copy, one taken away and one widened,
// and shows that the checks above catch both: a broken deploy file fails
// the test.
func TestMutatedAccountsFileFailsTheChecks(t *testing.T) {
	dir := t.TempDir()
	for _, f := range append([]string{"cluster.conf", "tls.conf", "accounts.conf"}, nodes...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if f == "accounts.conf" {
			// The worker loses the pulling of its triggers. (Not their
			// acknowledgement: the worker may answer what it receives,
			// allow_responses, for the API's snapshot requests, and an
			// acknowledgement is an answer to a pulled message.)
			b = mutate(t, b, "$BATON_NATS_NKEY_WORKER", `"$JS.API.CONSUMER.MSG.NEXT.BATON_OUTBOX.turns"`, "")
			// The api may publish on every Baton subject.
			b = mutate(t, b, "$BATON_NATS_NKEY_API", `"baton.events.>"`, `"baton.>"`)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o600))
	}
	c := startCluster(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	require.NoError(t, checkRelayOwnsTheOutboxStream(ctx, c), "what the mutation did not touch still works")
	require.NoError(t, checkAPIOwnsTheEventsStream(ctx, c), "what the mutation did not touch still works")
	err := checkWorkerRunsTurns(ctx, c)
	require.ErrorContains(t, err, "refused by the server", "without its pull permission the worker check must fail")
	require.ErrorContains(t, err, "$JS.API.CONSUMER.MSG.NEXT.BATON_OUTBOX.turns")
	err = checkAPICannotPublishTriggers(ctx, c)
	require.ErrorContains(t, err, "want a permissions violation", "with baton.> the api check must fail")
}

// mutate replaces the first line holding old in the user block of
// accounts.conf that starts at marker (its nkey variable).
func mutate(t *testing.T, conf []byte, marker, old, replacement string) []byte {
	t.Helper()
	s := string(conf)
	start := strings.Index(s, "nkey: "+marker)
	require.GreaterOrEqual(t, start, 0, "accounts.conf has no user %s", marker)
	end := strings.Index(s[start+1:], "nkey: ")
	require.Greater(t, end, 0)
	block := s[start : start+1+end]
	i := strings.Index(block, old)
	require.GreaterOrEqual(t, i, 0, "the block of %s in accounts.conf has no %s: update the mutation test", marker, old)
	lineStart := strings.LastIndex(block[:i], "\n") + 1
	lineEnd := i + strings.Index(block[i:], "\n")
	line := block[lineStart:lineEnd]
	require.Equal(t, old, strings.TrimSpace(line), "the line to change holds more than %s", old)
	mutated := block[:lineStart] + strings.Replace(line, old, replacement, 1) + block[lineEnd:]
	return []byte(s[:start] + mutated + s[start+1+end:])
}

func checkRelayOwnsTheOutboxStream(ctx context.Context, c *cluster) error {
	relay, err := c.dial("relay")
	if err != nil {
		return err
	}
	defer relay.nc.Close()
	var stream jetstream.Stream
	if err := relay.allowed(ctx, "relay creates the outbox stream", provision(func(ctx context.Context) (err error) {
		stream, _, err = batonnats.ProvisionStream(ctx, relay.js, outboxStream, batonnats.ProvisionOptions{})
		return err
	})); err != nil {
		return err
	}
	var info *jetstream.StreamInfo
	if err := relay.allowed(ctx, "relay reads the outbox stream", func(ctx context.Context) (err error) {
		info, err = stream.Info(ctx)
		return err
	}); err != nil {
		return err
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		return fmt.Errorf("the outbox stream should have 3 replicas with a leader, has %d (cluster %+v)", info.Config.Replicas, info.Cluster)
	}
	// Its metrics show every durable's backlog (relay/streamstate.go).
	if err := relay.allowed(ctx, "relay lists the outbox stream's consumers", func(ctx context.Context) error {
		l := stream.ListConsumers(ctx)
		for range l.Info() {
		}
		return l.Err()
	}); err != nil {
		return err
	}
	longer := outboxStream
	longer.MaxAge += time.Hour
	if err := relay.allowed(ctx, "relay updates the outbox stream", provision(func(ctx context.Context) error {
		if _, _, err := batonnats.ProvisionStream(ctx, relay.js, longer, batonnats.ProvisionOptions{}); err != nil {
			return err
		}
		// Back to the shipped settings: a reduction of the max age, which
		// the owner makes only when told to.
		_, _, err := batonnats.ProvisionStream(ctx, relay.js, outboxStream, batonnats.ProvisionOptions{AllowShrink: true})
		return err
	})); err != nil {
		return err
	}
	for i := range 3 {
		msg := nats.NewMsg(batonnats.Subject(outboxStream.SubjectPrefix, outboxStream.Partitions, conversation))
		msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("outbox-%d", i+1))
		msg.Data = []byte(fmt.Sprintf(`{"outbox_id":%d}`, i+1))
		if err := relay.allowed(ctx, "relay publishes a trigger", func(ctx context.Context) error {
			// As the relay does, retry while the new stream's leader is
			// not yet known to this client's node (no responders).
			ack, err := relay.js.PublishMsg(ctx, msg, jetstream.WithRetryAttempts(50), jetstream.WithRetryWait(100*time.Millisecond))
			if err == nil && ack.Stream != outboxStream.Name {
				err = fmt.Errorf("stored in %s, want %s", ack.Stream, outboxStream.Name)
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

func checkAPIOwnsTheEventsStream(ctx context.Context, c *cluster) error {
	api, err := c.dial("api")
	if err != nil {
		return err
	}
	defer api.nc.Close()
	return api.allowed(ctx, "api creates the events stream", provision(func(ctx context.Context) error {
		_, _, err := batonnats.ProvisionEventsStream(ctx, api.js, eventsStream, batonnats.ProvisionOptions{})
		return err
	}))
}

// fetchAndAck pulls one message of a durable as the worker and the groups
// do and acknowledges it, waiting for the server to confirm the
// acknowledgement. A pull sent in the moment after the durable's creation,
// before its node has told the others, finds no responder and is sent
// again only when the pull's heartbeats are missed (Next reports that, and
// is called again): a short expiry keeps that wait short.
func fetchAndAck(ctx context.Context, cl *client, who string, cons jetstream.Consumer) error {
	var msg jetstream.Msg
	if err := cl.allowed(ctx, who+" pulls a trigger", func(ctx context.Context) error {
		it, err := cons.Messages(jetstream.PullMaxMessages(1), jetstream.PullExpiry(3*time.Second))
		if err != nil {
			return err
		}
		defer it.Stop()
		for {
			msg, err = it.Next(jetstream.NextContext(ctx))
			// Missed heartbeats are reported, and the iterator pulls
			// again: the durable may not have been known to the node
			// that got the first pull.
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				return err
			}
		}
	}); err != nil {
		return err
	}
	return cl.allowed(ctx, who+" acks a trigger", msg.DoubleAck)
}

func checkWorkerRunsTurns(ctx context.Context, c *cluster) error {
	worker, err := c.dial("worker")
	if err != nil {
		return err
	}
	defer worker.nc.Close()
	for _, name := range []string{outboxStream.Name, eventsStream.Name} {
		if err := worker.allowed(ctx, "worker reads stream "+name, func(ctx context.Context) error {
			_, err := worker.js.Stream(ctx, name)
			return err
		}); err != nil {
			return err
		}
	}
	var cons jetstream.Consumer
	if err := worker.allowed(ctx, "worker creates its durable turns", provision(func(ctx context.Context) (err error) {
		cons, err = batonnats.EnsureConsumer(ctx, worker.js, outboxStream, batonnats.ConsumerConfig{})
		return err
	})); err != nil {
		return err
	}
	if err := worker.allowed(ctx, "worker reads its durable", func(ctx context.Context) error {
		_, err := worker.js.Consumer(ctx, outboxStream.Name, batonnats.DefaultConsumer)
		return err
	}); err != nil {
		return err
	}
	return fetchAndAck(ctx, worker, "worker", cons)
}

// checkStopsAndSnapshotsReachTheWorker: the API tells the worker of a
// stop, and asks it for a running reply's snapshot, which the worker
// answers.
func checkStopsAndSnapshotsReachTheWorker(ctx context.Context, c *cluster) error {
	node := c.Servers[0].ClientURL()
	api, err := c.dialAt("api", node)
	if err != nil {
		return err
	}
	defer api.nc.Close()
	worker, err := c.dialAt("worker", node)
	if err != nil {
		return err
	}
	defer worker.nc.Close()
	stops := make(chan *nats.Msg, 1)
	if err := worker.allowed(ctx, "worker hears stop notices and snapshot requests", func(context.Context) error {
		if _, err := worker.nc.ChanSubscribe(batonnats.StopPrefix+".>", stops); err != nil {
			return err
		}
		_, err := worker.nc.Subscribe(batonnats.SnapshotPrefix+".>", func(m *nats.Msg) { _ = m.Respond([]byte(`{"run_id":"run_1","seq":0,"parts":[]}`)) })
		return err
	}); err != nil {
		return err
	}
	if err := api.allowed(ctx, "api tells of a stop", func(context.Context) error {
		return api.nc.Publish(batonnats.StopSubject(conversation, "run_1"), nil)
	}); err != nil {
		return err
	}
	select {
	case <-stops:
	case <-time.After(10 * time.Second):
		return errors.New("the api's stop notice did not reach the worker within 10s")
	}
	return api.allowed(ctx, "api asks the worker for a snapshot", func(ctx context.Context) error {
		m, err := api.nc.RequestWithContext(ctx, batonnats.SnapshotSubject(conversation, "run_1"), nil)
		if err == nil && !strings.Contains(string(m.Data), "run_1") {
			err = fmt.Errorf("the snapshot answer is %q", m.Data)
		}
		return err
	})
}

func checkLiveAndEventsReachTheAPI(ctx context.Context, c *cluster) error {
	// Both on one node: a subscription reaches the other nodes a moment
	// after the subscriber's flush, and a live delta published before
	// that is gone, as core NATS promises.
	node := c.Servers[0].ClientURL()
	api, err := c.dialAt("api", node)
	if err != nil {
		return err
	}
	defer api.nc.Close()
	worker, err := c.dialAt("worker", node)
	if err != nil {
		return err
	}
	defer worker.nc.Close()

	deltas := make(chan *nats.Msg, 4)
	if err := api.allowed(ctx, "api subscribes to live deltas", func(context.Context) error {
		_, err := api.nc.ChanSubscribe(batonnats.LiveConversationSubject(conversation), deltas)
		return err
	}); err != nil {
		return err
	}
	// As the api follows a conversation: an ordered consumer, read
	// through Messages (with a short expiry for the reason fetchAndAck
	// gives).
	var events jetstream.MessagesContext
	if err := api.allowed(ctx, "api follows a conversation's events", func(ctx context.Context) error {
		// A create request sent while the cluster still places the events
		// stream made just before can go unanswered: ask again, as the
		// API does when it starts following, until the step's deadline.
		for {
			tryCtx, cancel := context.WithTimeout(ctx, 4*time.Second)
			cons, err := api.js.OrderedConsumer(tryCtx, eventsStream.Name, jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{eventsStream.Subject(conversation)},
			})
			cancel()
			if err == nil {
				events, err = cons.Messages(jetstream.PullExpiry(3 * time.Second))
			}
			if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
		}
	}); err != nil {
		return err
	}
	defer events.Stop()

	delta, _ := json.Marshal(map[string]any{"run_id": "run_1", "seq": 1, "type": "delta", "text": "Hel"})
	if err := worker.allowed(ctx, "worker publishes a live delta", func(context.Context) error {
		return worker.nc.Publish(batonnats.LiveSubject(conversation, "run_1"), delta)
	}); err != nil {
		return err
	}
	select {
	case m := <-deltas:
		if string(m.Data) != string(delta) {
			return fmt.Errorf("api got live delta %q, want %q", m.Data, delta)
		}
	case <-time.After(10 * time.Second):
		return errors.New("the worker's live delta did not reach the api within 10s")
	}

	for _, pub := range []struct {
		who string
		cl  *client
		typ batonnats.EventType
	}{{"worker", worker, batonnats.EventProcessing}, {"api", api, batonnats.EventMessage}} {
		if err := pub.cl.allowed(ctx, pub.who+" publishes a conversation event", func(ctx context.Context) error {
			return batonnats.NewEventPublisher(pub.cl.js, eventsStream, false).Publish(ctx, batonnats.ConversationEvent{Type: pub.typ, ConversationID: conversation}, "")
		}); err != nil {
			return err
		}
		var got batonnats.ConversationEvent
		if err := api.allowed(ctx, "api reads the "+pub.who+"'s event", func(ctx context.Context) error {
			m, err := events.Next(jetstream.NextContext(ctx))
			if err != nil {
				return err
			}
			return json.Unmarshal(m.Data(), &got)
		}); err != nil {
			return err
		}
		if got.Type != pub.typ || got.ConversationID != conversation {
			return fmt.Errorf("api read event %+v, want %s of %q", got, pub.typ, conversation)
		}
	}
	return nil
}

func checkGroupOwnsItsDurable(ctx context.Context, c *cluster) error {
	group, err := c.dial("group-audit")
	if err != nil {
		return err
	}
	defer group.nc.Close()
	var cons jetstream.Consumer
	if err := group.allowed(ctx, "group audit creates its durable", provision(func(ctx context.Context) (err error) {
		cons, err = batonnats.EnsureConsumer(ctx, group.js, outboxStream, batonnats.ConsumerConfig{Name: "audit"})
		return err
	})); err != nil {
		return err
	}
	return fetchAndAck(ctx, group, "group audit", cons)
}

func checkReplayResetsAGroup(ctx context.Context, c *cluster) error {
	replay, err := c.dial("replay")
	if err != nil {
		return err
	}
	defer replay.nc.Close()
	var stream jetstream.Stream
	if err := replay.allowed(ctx, "replay reads the outbox stream", func(ctx context.Context) (err error) {
		stream, err = replay.js.Stream(ctx, outboxStream.Name)
		return err
	}); err != nil {
		return err
	}
	for _, group := range []string{"turns", "audit"} {
		if err := replay.allowed(ctx, "replay reads the progress of "+group, func(ctx context.Context) error {
			_, err := replay.js.Consumer(ctx, outboxStream.Name, group)
			return err
		}); err != nil {
			return err
		}
	}
	if err := replay.allowed(ctx, "replay resets group audit", func(ctx context.Context) error {
		_, err := replay.js.ResetConsumerToSequence(ctx, outboxStream.Name, "audit", 1)
		return err
	}); err != nil {
		return err
	}
	// A point in time resolves through a short-lived ephemeral consumer.
	start := time.Now().Add(-time.Hour)
	return replay.allowed(ctx, "replay finds the first event at a time", func(ctx context.Context) error {
		probe, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
			AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute, MemoryStorage: true, Replicas: 1,
		})
		if err != nil {
			return err
		}
		return stream.DeleteConsumer(ctx, probe.CachedInfo().Name)
	})
}

func checkStatusReads(ctx context.Context, c *cluster) error { return checkReads(ctx, c, "status") }

func checkConsoleReads(ctx context.Context, c *cluster) error { return checkReads(ctx, c, "console") }

// checkReads: a read-only user (status, console) reads the account, the
// outbox stream and the list of its consumers.
func checkReads(ctx context.Context, c *cluster, user string) error {
	status, err := c.dial(user)
	if err != nil {
		return err
	}
	defer status.nc.Close()
	if err := status.allowed(ctx, user+" reads the account", func(ctx context.Context) error {
		_, err := status.js.AccountInfo(ctx)
		return err
	}); err != nil {
		return err
	}
	var stream jetstream.Stream
	if err := status.allowed(ctx, user+" reads the outbox stream", func(ctx context.Context) (err error) {
		stream, err = status.js.Stream(ctx, outboxStream.Name)
		return err
	}); err != nil {
		return err
	}
	var groups []string
	if err := status.allowed(ctx, user+" lists the groups", func(ctx context.Context) error {
		l := stream.ListConsumers(ctx)
		for ci := range l.Info() {
			groups = append(groups, ci.Name)
		}
		return l.Err()
	}); err != nil {
		return err
	}
	slices.Sort(groups)
	if !slices.Equal(groups, []string{"audit", "turns"}) {
		return fmt.Errorf("%s listed groups %v, want [audit turns]", user, groups)
	}
	return nil
}

func checkAPICannotPublishTriggers(ctx context.Context, c *cluster) error {
	api, err := c.dial("api")
	if err != nil {
		return err
	}
	defer api.nc.Close()
	return api.refused(ctx, "api publishes a trigger", "baton.outbox.x", func(context.Context) error {
		return api.nc.Publish("baton.outbox.x", []byte("{}"))
	})
}

func checkWorkerCannotChangeTheStreams(ctx context.Context, c *cluster) error {
	for _, step := range []struct {
		what, subject string
		op            func(context.Context, *client) error
	}{
		{"worker deletes the outbox stream", "$JS.API.STREAM.DELETE.BATON_OUTBOX", func(ctx context.Context, w *client) error {
			return w.js.DeleteStream(ctx, outboxStream.Name)
		}},
		{"worker updates the outbox stream", "$JS.API.STREAM.UPDATE.BATON_OUTBOX", func(ctx context.Context, w *client) error {
			cfg := outboxStream.JetStreamConfig()
			cfg.MaxAge = time.Minute
			_, err := w.js.UpdateStream(ctx, cfg)
			return err
		}},
		{"worker purges the outbox stream", "$JS.API.STREAM.PURGE.BATON_OUTBOX", func(ctx context.Context, w *client) error {
			s, err := w.js.Stream(ctx, outboxStream.Name)
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		}},
		{"worker publishes a trigger", "baton.outbox.0.x", func(_ context.Context, w *client) error {
			return w.nc.Publish("baton.outbox.0.x", []byte("{}"))
		}},
		{"worker deletes the events stream", "$JS.API.STREAM.DELETE.BATON_EVENTS", func(ctx context.Context, w *client) error {
			return w.js.DeleteStream(ctx, eventsStream.Name)
		}},
		// The api owns the events stream; a worker reads its settings and
		// publishes, and provisions nothing.
		{"worker provisions the events stream", "$JS.API.STREAM.UPDATE.BATON_EVENTS", func(ctx context.Context, w *client) error {
			changed := eventsStream
			changed.MaxAge += time.Hour
			_, _, err := batonnats.ProvisionEventsStream(ctx, w.js, changed, batonnats.ProvisionOptions{})
			return err
		}},
	} {
		if err := refusedAs(ctx, c, "worker", step.what, step.subject, step.op); err != nil {
			return err
		}
	}
	// The stream is untouched.
	relay, err := c.dial("relay")
	if err != nil {
		return err
	}
	defer relay.nc.Close()
	s, err := relay.js.Stream(ctx, outboxStream.Name)
	if err != nil {
		return fmt.Errorf("the outbox stream should still be there: %w", err)
	}
	if s.CachedInfo().Config.MaxAge != outboxStream.MaxAge || s.CachedInfo().State.Msgs != 3 {
		return fmt.Errorf("the outbox stream changed: max age %s, %d messages", s.CachedInfo().Config.MaxAge, s.CachedInfo().State.Msgs)
	}
	return nil
}

// provision wraps an idempotent provisioning call so that it is made again
// when its answer is lost (a JetStream API request in flight while the
// meta leader changes gets none) and when the meta leader finds no peers
// to place the replicas on because it holds one of them offline for a
// moment (on a loaded machine a node can miss its beat right after the
// cluster formed). The components' own provisioning loops do the same.
func provision(op func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := op(actx)
			cancel()
			var apiErr *jetstream.APIError
			switch {
			case ctx.Err() != nil:
				return err
			case errors.Is(err, context.DeadlineExceeded):
			case errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeersForPlacement:
				select {
				case <-ctx.Done():
					return err
				case <-time.After(250 * time.Millisecond):
				}
			default:
				return err
			}
		}
	}
}

// errCodeNoPeersForPlacement is JetStream's "no suitable peers for
// placement" (nats-server's JSClusterNoPeersErrF).
const errCodeNoPeersForPlacement jetstream.ErrorCode = 10005

// refusedAs connects as user and runs op, which the server must refuse on
// subject. Each refusal gets a connection of its own, since a refusal
// stays the connection's last error.
func refusedAs(ctx context.Context, c *cluster, user, what, subject string, op func(context.Context, *client) error) error {
	cl, err := c.dial(user)
	if err != nil {
		return err
	}
	defer cl.nc.Close()
	return cl.refused(ctx, what, subject, func(ctx context.Context) error { return op(ctx, cl) })
}

// pullOnce asks durable for one message through the JetStream API directly,
// as a client that skipped creating or reading the durable would.
func pullOnce(ctx context.Context, cl *client, durable string) error {
	_, err := cl.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT."+outboxStream.Name+"."+durable, []byte(`{"batch":1,"expires":1000000000}`))
	return err
}

func checkGroupCannotTakeAnotherDurable(ctx context.Context, c *cluster) error {
	for _, step := range []struct {
		user, what, subject string
		op                  func(context.Context, *client) error
	}{
		{"group-audit", "group audit creates the durable turns", "$JS.API.CONSUMER.CREATE.BATON_OUTBOX.turns", func(ctx context.Context, g *client) error {
			_, err := batonnats.EnsureConsumer(ctx, g.js, outboxStream, batonnats.ConsumerConfig{})
			return err
		}},
		{"group-audit", "group audit pulls from turns", "$JS.API.CONSUMER.MSG.NEXT.BATON_OUTBOX.turns", func(ctx context.Context, g *client) error {
			return pullOnce(ctx, g, "turns")
		}},
		{"group-webhook", "group webhook changes the durable audit", "$JS.API.CONSUMER.CREATE.BATON_OUTBOX.audit", func(ctx context.Context, g *client) error {
			_, err := batonnats.EnsureConsumer(ctx, g.js, outboxStream, batonnats.ConsumerConfig{Name: "audit"})
			return err
		}},
		{"group-audit", "group audit deletes its own durable", "$JS.API.CONSUMER.DELETE.BATON_OUTBOX.audit", func(ctx context.Context, g *client) error {
			return g.js.DeleteConsumer(ctx, outboxStream.Name, "audit")
		}},
		{"group-audit", "group audit reads the outbox subjects around JetStream", "baton.outbox.>", func(_ context.Context, g *client) error {
			_, err := g.nc.SubscribeSync("baton.outbox.>")
			return err
		}},
	} {
		if err := refusedAs(ctx, c, step.user, step.what, step.subject, step.op); err != nil {
			return err
		}
	}
	return nil
}

func checkReplayCannotTakeOverDurables(ctx context.Context, c *cluster) error {
	for _, step := range []struct {
		what, subject string
		op            func(context.Context, *client) error
	}{
		{"replay creates the durable turns", "$JS.API.CONSUMER.CREATE.BATON_OUTBOX.turns", func(ctx context.Context, r *client) error {
			_, err := batonnats.EnsureConsumer(ctx, r.js, outboxStream, batonnats.ConsumerConfig{})
			return err
		}},
		{"replay deletes the durable turns", "$JS.API.CONSUMER.DELETE.BATON_OUTBOX.turns", func(ctx context.Context, r *client) error {
			return r.js.DeleteConsumer(ctx, outboxStream.Name, "turns")
		}},
		{"replay deletes the durable audit", "$JS.API.CONSUMER.DELETE.BATON_OUTBOX.audit", func(ctx context.Context, r *client) error {
			return r.js.DeleteConsumer(ctx, outboxStream.Name, "audit")
		}},
		{"replay pulls from turns", "$JS.API.CONSUMER.MSG.NEXT.BATON_OUTBOX.turns", func(ctx context.Context, r *client) error {
			return pullOnce(ctx, r, "turns")
		}},
	} {
		if err := refusedAs(ctx, c, "replay", step.what, step.subject, step.op); err != nil {
			return err
		}
	}
	return nil
}

func checkStatusIsReadOnly(ctx context.Context, c *cluster) error {
	return checkReadOnly(ctx, c, "status")
}

func checkConsoleIsReadOnly(ctx context.Context, c *cluster) error {
	if err := checkReadOnly(ctx, c, "console"); err != nil {
		return err
	}
	return refusedAs(ctx, c, "console", "console deletes the durable turns", "$JS.API.CONSUMER.DELETE.BATON_OUTBOX.turns", func(ctx context.Context, s *client) error {
		return s.js.DeleteConsumer(ctx, outboxStream.Name, "turns")
	})
}

// checkReadOnly: a read-only user (status, console) reads no message,
// creates no consumer and deletes no stream.
func checkReadOnly(ctx context.Context, c *cluster, user string) error {
	for _, step := range []struct {
		what, subject string
		op            func(context.Context, *client) error
	}{
		{user + " reads a message", "$JS.API.STREAM.MSG.GET.BATON_OUTBOX", func(ctx context.Context, s *client) error {
			st, err := s.js.Stream(ctx, outboxStream.Name)
			if err != nil {
				return err
			}
			_, err = st.GetMsg(ctx, 1)
			return err
		}},
		{user + " creates a consumer", "$JS.API.CONSUMER.CREATE.BATON_OUTBOX", func(ctx context.Context, s *client) error {
			_, err := s.js.CreateConsumer(ctx, outboxStream.Name, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
			return err
		}},
		{user + " deletes the outbox stream", "$JS.API.STREAM.DELETE.BATON_OUTBOX", func(ctx context.Context, s *client) error {
			return s.js.DeleteStream(ctx, outboxStream.Name)
		}},
	} {
		if err := refusedAs(ctx, c, user, step.what, step.subject, step.op); err != nil {
			return err
		}
	}
	return nil
}

func checkNoComponentReadsAnothersInbox(ctx context.Context, c *cluster) error {
	for _, step := range []struct{ user, subject string }{
		{"worker", "_INBOX_relay.>"},
		{"api", "_INBOX_worker.>"},
		{"relay", "_INBOX_api.>"},
		{"group-audit", "_INBOX_webhook.>"},
		{"status", "_INBOX.>"},
		{"console", "_INBOX_api.>"},
		{"replay", ">"},
		// Live deltas are for the api only.
		{"relay", "baton.live.>"},
	} {
		if err := refusedAs(ctx, c, step.user, step.user+" subscribes to "+step.subject, step.subject, func(_ context.Context, cl *client) error {
			_, err := cl.nc.SubscribeSync(step.subject)
			return err
		}); err != nil {
			return err
		}
	}
	// With the default inbox a component gets no answer at all: its
	// replies' subscription is refused.
	o := c.options("worker")
	o.InboxPrefix = ""
	violations := make(chan error, 4)
	nc, err := natsconn.Connect(o, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	go func() {
		_, _ = js.Stream(sctx, outboxStream.Name)
	}()
	select {
	case v := <-violations:
		if !errors.Is(v, nats.ErrPermissionViolation) || !strings.Contains(v.Error(), "_INBOX.") {
			return fmt.Errorf("a worker on the default inbox got %v, want a subscription refusal on _INBOX", v)
		}
	case <-sctx.Done():
		return errors.New("a worker on the default inbox should be refused its replies' subscription")
	}
	return nil
}

func checkOnlyKnownUsersWithTheCAConnect(ctx context.Context, c *cluster) error {
	// No credentials.
	_, err := natsconn.Connect(natsconn.Options{URL: c.URLs, TLSCAFile: filepath.Join(c.Certs, "ca.pem")}, nats.MaxReconnects(0))
	if !errors.Is(err, nats.ErrAuthorization) {
		return fmt.Errorf("a client without credentials: got %v, want an authorization violation", err)
	}
	// A well-formed seed the cluster does not know.
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	stranger := filepath.Join(c.Keys, "stranger.nk")
	if err := os.WriteFile(stranger, seed, 0o600); err != nil {
		return err
	}
	o := c.options("worker")
	o.NKeySeedFile = stranger
	_, err = natsconn.Connect(o, nats.MaxReconnects(0))
	if !errors.Is(err, nats.ErrAuthorization) {
		return fmt.Errorf("a client with an unknown nkey: got %v, want an authorization violation", err)
	}
	if strings.Contains(err.Error(), string(seed)) {
		return errors.New("the error quotes the seed")
	}
	// The right seed without the cluster's CA.
	o = c.options("worker")
	o.TLSCAFile = ""
	_, err = natsconn.Connect(o, nats.MaxReconnects(0))
	if err == nil || errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "certificate") {
		return fmt.Errorf("a client without the CA: got %v, want a certificate verification failure", err)
	}
	return nil
}

func checkTLSAndMonitoring(ctx context.Context, c *cluster) error {
	worker, err := c.dial("worker")
	if err != nil {
		return err
	}
	defer worker.nc.Close()
	if state, err := worker.nc.TLSConnectionState(); err != nil || !state.HandshakeComplete {
		return fmt.Errorf("the worker's connection should be TLS: %v", err)
	}
	for _, s := range c.Servers {
		routes, err := s.Routez(&server.RoutezOptions{})
		if err != nil {
			return err
		}
		if routes.NumRoutes < len(c.Servers)-1 {
			return fmt.Errorf("node %s has %d routes, want at least %d", s.Name(), routes.NumRoutes, len(c.Servers)-1)
		}
		if err := checkRouteRequiresACertificate(s.ClusterAddr().String(), filepath.Join(c.Certs, "ca.pem")); err != nil {
			return fmt.Errorf("node %s: %w", s.Name(), err)
		}
		if addr := s.MonitorAddr(); addr == nil || !addr.IP.IsLoopback() {
			return fmt.Errorf("node %s monitors on %v, want the loopback interface", s.Name(), addr)
		}
	}
	return nil
}

// checkRouteRequiresACertificate plays a machine that tries to join the
// cluster without a certificate. A route port speaks TLS from the first
// byte: a peer that speaks plain NATS gets no greeting, and one that shows
// no certificate of the CA has its handshake ended.
func checkRouteRequiresACertificate(addr, caFile string) error {
	plain, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer plain.Close()
	if err := plain.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := plain.Write([]byte("CONNECT {}\r\nPING\r\n")); err != nil {
		return err
	}
	greeting, _ := bufio.NewReader(plain).ReadString('\n')
	if strings.HasPrefix(greeting, "INFO") || strings.HasPrefix(greeting, "PONG") {
		return fmt.Errorf("the route port answered a plain-text peer with %q", greeting)
	}

	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	// The CA verifies the node's certificate; the handshake fails only
	// for want of a certificate of ours.
	tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3 reports the server's refusal of the client's (empty)
		// certificate on the first read.
		_, err = tc.Read(make([]byte, 1))
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		return fmt.Errorf("a route peer without a certificate got %v, want the handshake ended with 'certificate required'", err)
	}
	return nil
}
