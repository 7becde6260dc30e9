package pull_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer/pull"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// heldLookup is the loop's JetStream context with its first look at the
// durable held until the test lets it go: the test orders the events of a
// race that the kill test met by chance. Everything else goes to the real
// server.
type heldLookup struct {
	jetstream.JetStream
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *heldLookup) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	h.once.Do(func() {
		close(h.entered)
		<-h.release
	})
	return h.JetStream.Consumer(ctx, stream, name)
}

// When the durable is deleted, the client library ends the loop's
// subscription and the loop looks at the durable. With several workers in
// the group, another one may have created it again by then. The loop found
// it there, did nothing, and waited for a subscription that nobody would
// open: after a stream wipe in the kill test, every worker but the one that
// recreated the durable fetched nothing until it was restarted (24 s).
func TestALoopWhoseDurableWasCreatedAgainByAnotherMemberSubscribesAgain(t *testing.T) {
	f := newFixture(t, "PULL_REJOIN")
	ctx, admin, stream, consumer := f.ctx, f.admin, f.stream, f.consumer

	held := &heldLookup{JetStream: f.js, entered: make(chan struct{}), release: make(chan struct{})}
	// No periodic look during the test: only the loop's own reaction to
	// its ended subscription can bring it back.
	await := runLoop(t, ctx, pull.Config{Stream: stream, Consumer: consumer, CheckInterval: time.Hour}, held)
	f.publish("before")
	await("before")

	// Delete the durable: the library ends the subscription and the loop
	// looks at the durable, held here until another member of the group
	// has created it again.
	require.NoError(t, admin.DeleteConsumer(ctx, stream.Name, consumer.Name))
	select {
	case <-held.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the loop did not look at its durable after the subscription ended")
	}
	_, err := batonnats.EnsureConsumer(ctx, admin, stream, consumer)
	require.NoError(t, err)
	close(held.release)

	f.publish("after")
	await("after")
}

// After a stream is lost with its store, the client reconnects and asks
// for messages before anyone has created the stream and the durable again.
// The server answers that pull with a status the client library does not
// act on; the library then waits for the messages it asked for until two
// heartbeats are missing. With its default heartbeat that was 30 s of a
// worker fetching nothing while another member of the group, which had
// created the durable again, did all the work.
func TestALoopWhosePullWasLostWithTheStreamAsksAgainWithinAFewHeartbeats(t *testing.T) {
	f := newFixture(t, "PULL_WIPE")
	ctx, admin, stream, consumer := f.ctx, f.admin, f.stream, f.consumer

	// No periodic look at the durable during the test: it would find the
	// durable there anyway.
	await := runLoop(t, ctx, pull.Config{Stream: stream, Consumer: consumer, CheckInterval: time.Hour}, f.js)
	f.publish("before")
	await("before")

	reconnected := make(chan struct{}, 4)
	f.js.Conn().SetReconnectHandler(func(*natsclient.Conn) { reconnected <- struct{}{} })
	f.nats.Wipe()
	select {
	case <-reconnected:
	case <-time.After(20 * time.Second):
		t.Fatal("the loop's connection did not come back after the wipe")
	}
	// The loop's pull, sent on reconnecting, found no durable. Now another
	// member of the group creates the stream and the durable again.
	_, err := admin.CreateStream(ctx, stream.JetStreamConfig())
	require.NoError(t, err)
	_, err = batonnats.EnsureConsumer(ctx, admin, stream, consumer)
	require.NoError(t, err)
	f.publish("after")
	// Two missed heartbeats (4 s) and a new pull; the library's default
	// would take 30 s.
	await("after")
}

func TestAHeartbeatOutsideItsRangeIsRefused(t *testing.T) {
	f := newFixture(t, "PULL_HB")
	for _, hb := range []time.Duration{400 * time.Millisecond, 20 * time.Second} {
		_, err := pull.New(pull.Config{Stream: f.stream, Heartbeat: hb}, f.js)
		require.EqualError(t, err, "pull: Config.Heartbeat "+hb.String()+" must be from 500ms to 15s")
	}
	// The least the loop takes is the least the client library takes: a
	// loop it accepts must be able to subscribe.
	await := runLoop(t, f.ctx, pull.Config{Stream: f.stream, Consumer: f.consumer, Heartbeat: 500 * time.Millisecond}, f.js)
	f.publish("x")
	await("x")
}

// runLoop runs a loop with cfg over js until the test ends; the function it returns
// waits up to 20 s for a message with body. Earlier messages may come
// first: a durable created again delivers the stream from its start.
func runLoop(t *testing.T, ctx context.Context, cfg pull.Config, js jetstream.JetStream) (await func(body string)) {
	t.Helper()
	loop, err := pull.New(cfg, js)
	require.NoError(t, err)
	got := make(chan string, 16)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- loop.Run(runCtx, func(m jetstream.Msg) {
			_ = m.Ack()
			got <- string(m.Data())
		})
	}()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	return func(body string) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case b := <-got:
				if b == body {
					return
				}
			case <-deadline:
				t.Fatalf("%s did not arrive within 20s", body)
			}
		}
	}
}

// fixture is a NATS server with a stream for one test: admin plays the
// rest of the group and the relay, js is the loop's own connection.
type fixture struct {
	t         *testing.T
	nats      *testenv.NATS
	admin, js jetstream.JetStream
	stream    batonnats.StreamConfig
	consumer  batonnats.ConsumerConfig
	ctx       context.Context
}

func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	f := &fixture{t: t, nats: testenv.StartNATS(t), consumer: batonnats.ConsumerConfig{Name: "turns"},
		stream: batonnats.StreamConfig{Name: name, SubjectPrefix: strings.ToLower(strings.ReplaceAll(name, "_", "."))}.WithDefaults()}
	_, f.admin = f.nats.Connect(t)
	_, f.js = f.nats.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	f.ctx = ctx
	_, err := f.admin.CreateStream(ctx, f.stream.JetStreamConfig())
	require.NoError(t, err)
	return f
}

// publish puts body on the stream, as the relay would.
func (f *fixture) publish(body string) {
	f.t.Helper()
	_, err := f.admin.Publish(f.ctx, f.stream.SubjectPrefix+".p0.c1", []byte(body))
	require.NoError(f.t, err)
}
