package consumer

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// bundle is one test's Postgres, NATS, relay and user.
type bundle struct {
	*outboxtest.Bundle
}

// setup starts a database, a NATS server and a real relay for t.
func setup(t testing.TB) *bundle {
	t.Helper()
	return &bundle{Bundle: outboxtest.Setup(t)}
}

// testConfig is a worker configuration with short timings for tests.
func (b *bundle) testConfig() Config {
	return Config{
		Agent:            Echo{Directives: true},
		Stream:           b.Stream,
		Lease:            2 * time.Second,
		Debounce:         NoDebounce,
		BusyDelay:        50 * time.Millisecond,
		RetryDelay:       200 * time.Millisecond,
		RecoveryInterval: 500 * time.Millisecond,
		ShutdownTimeout:  3 * time.Second,
	}
}

// startWorker runs a worker until the test ends.
func (b *bundle) startWorker(cfg Config) *Worker {
	b.T.Helper()
	return b.startWorkerOn(cfg, b.DB.Pool)
}

// startWorkerOn runs a worker over pool until the test ends.
func (b *bundle) startWorkerOn(cfg Config, pool *pgxpool.Pool) *Worker {
	b.T.Helper()
	w, err := New(cfg, pool, b.JS)
	require.NoError(b.T, err)
	outboxtest.RunInBackground(b.T, "worker", w.Run)
	return w
}

// settled waits until every outbox row is done or error and the consumer
// group holds no unacknowledged or undelivered trigger.
func (b *bundle) settled(timeout time.Duration) {
	b.T.Helper()
	b.Eventually(timeout, func() bool {
		return b.Count(`SELECT count(*) FROM agent_outbox WHERE status NOT IN ('done', 'error')`) == 0
	}, "outbox rows are all done or error")
	b.ConsumerSettled(DefaultConsumerName, timeout)
}

const DefaultConsumerName = batonnats.DefaultConsumer

// events records the conversation events a worker reports, and signals
// each one to tests that wait for a particular event.
type events struct {
	mu     sync.Mutex
	all    []batonnats.ConversationEvent
	signal testenv.Signal
}

func (e *events) record(ev batonnats.ConversationEvent) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
	e.signal.Notify()
}

func (e *events) has(conversationID string, typ batonnats.EventType) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.ConversationID == conversationID && ev.Type == typ {
			return true
		}
	}
	return false
}

// wait waits until the worker reported an event of typ for the
// conversation.
func (e *events) wait(t testing.TB, timeout time.Duration, conversationID string, typ batonnats.EventType) {
	t.Helper()
	testenv.WaitFor(t, &e.signal, timeout, func() bool { return e.has(conversationID, typ) },
		"a %s event for conversation %q", typ, conversationID)
}
