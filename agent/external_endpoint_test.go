package agent_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// recordings is a database that counts the records written through it,
// signalling each, and fails them while broken is set.
type recordings struct {
	schema.Executor
	written atomic.Int64
	broken  atomic.Bool
	signal  testenv.Signal
}

func (r *recordings) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	defer r.signal.Notify()
	if r.broken.Load() {
		return pgconn.CommandTag{}, errors.New("the database is away")
	}
	tag, err := r.Executor.Exec(ctx, sql, args...)
	if err == nil {
		r.written.Add(1)
	}
	return tag, err
}

func (r *recordings) waitWritten(t *testing.T, n int64) {
	t.Helper()
	testenv.WaitFor(t, &r.signal, 10*time.Second, func() bool { return r.written.Load() >= n }, "%d records written", n)
}

// startRecorder runs a recorder with interval on db until the test ends.
func startRecorder(t *testing.T, db schema.Executor, interval time.Duration) (*agent.EndpointRecorder, func()) {
	t.Helper()
	rec, err := agent.NewEndpointRecorder(agent.EndpointRecorderConfig{Interval: interval})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx, db) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return rec, stop
}

func endpointRow(t *testing.T, db *testenv.DB, name string) schema.AgentEndpoint {
	t.Helper()
	all, err := schema.ListAgentEndpoints(context.Background(), db.Pool)
	require.NoError(t, err)
	for _, a := range all {
		if a.Name == name {
			return a
		}
	}
	t.Fatalf("agent %s is not recorded: %+v", name, all)
	return schema.AgentEndpoint{}
}

func TestTheRecorderWritesAChangeOfStateAtOnceAndTheSameStateAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	rec := &recordings{Executor: db.Pool}
	r, stop := startRecorder(t, rec, time.Hour)
	ep := agent.EndpointOf(agent.ProtocolAGUI, "http://agent.internal:8000/agent")
	at := time.Now().Truncate(time.Microsecond)

	r.Observe(agent.EndpointOutcome{Endpoint: ep, At: at})
	rec.waitWritten(t, 1)
	a := endpointRow(t, db, ep.Name)
	require.True(t, a.Reachable)
	require.True(t, a.Since.Equal(at))
	require.Equal(t, "http://agent.internal:8000", a.Origin)
	require.Equal(t, agent.ProtocolAGUI, a.Protocol)

	// More answers within the interval are not written one by one.
	for i := range 100 {
		r.Observe(agent.EndpointOutcome{Endpoint: ep, At: at.Add(time.Duration(i+1) * time.Millisecond)})
	}
	failedAt := at.Add(time.Second)
	r.Observe(agent.EndpointOutcome{Endpoint: ep, At: failedAt, Error: "agent_unavailable: the connection failed: connection refused"})
	rec.waitWritten(t, 2)
	a = endpointRow(t, db, ep.Name)
	require.False(t, a.Reachable, "a failure after an answer is written at once")
	require.True(t, a.Since.Equal(failedAt), "unreachable since the failure")
	require.Equal(t, "agent_unavailable: the connection failed: connection refused", a.LastError)
	require.True(t, a.LastErrorAt.Equal(failedAt))
	require.True(t, a.LastOKAt.Equal(at.Add(100*time.Millisecond)), "the last answer before it went with the same record")
	require.EqualValues(t, 2, rec.written.Load(), "100 answers in a row made no record of their own")

	// More failures within the interval wait; stopping writes them.
	againAt := failedAt.Add(time.Second)
	r.Observe(agent.EndpointOutcome{Endpoint: ep, At: againAt, Error: "agent_timeout: the agent sent nothing for 1m0s"})
	r.Observe(agent.EndpointOutcome{Endpoint: ep, At: againAt.Add(time.Second), Error: "agent_timeout: the agent sent nothing for 1m0s"})
	stop()
	require.EqualValues(t, 3, rec.written.Load())
	a = endpointRow(t, db, ep.Name)
	require.True(t, a.Since.Equal(failedAt), "failing since the first failure")
	require.True(t, a.LastErrorAt.Equal(againAt.Add(time.Second)), "the last failure was written when the recorder stopped")
	require.Equal(t, "agent_timeout: the agent sent nothing for 1m0s", a.LastError)
}

func TestAWorkersRecordMergesWithWhatOtherWorkersRecorded(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	ep := agent.EndpointOf(agent.ProtocolAISDK, "https://agent.example.com/api/chat")
	t0 := time.Now().Truncate(time.Microsecond)
	at := func(s int) *time.Time { v := t0.Add(time.Duration(s) * time.Second); return &v }
	record := func(r schema.AgentReach) {
		r.Name, r.Protocol, r.Origin = ep.Name, ep.Protocol, ep.Origin
		require.NoError(t, schema.RecordAgentReach(ctx, db.Pool, r))
	}

	// Worker A: answered at 10.
	record(schema.AgentReach{Reachable: true, Since: *at(10), OKAt: at(10)})
	// Worker B's failure at 5 arrives late: the answer at 10 is newer.
	record(schema.AgentReach{Reachable: false, Since: *at(5), ErrorAt: at(5), Error: "agent_unavailable: 502 Bad Gateway"})
	a := endpointRow(t, db, ep.Name)
	require.True(t, a.Reachable)
	require.True(t, a.Since.Equal(*at(10)))
	require.Equal(t, "agent_unavailable: 502 Bad Gateway", a.LastError, "the failure is shown, as the last one")

	// Worker B fails again at 20: unreachable since then.
	record(schema.AgentReach{Reachable: false, Since: *at(5), ErrorAt: at(20), Error: "agent_auth: 401 Unauthorized"})
	a = endpointRow(t, db, ep.Name)
	require.False(t, a.Reachable)
	require.True(t, a.Since.Equal(*at(10)), "worker B saw failures since 5, but worker A's answer at 10 came after")
	require.Equal(t, "agent_auth: 401 Unauthorized", a.LastError)
	require.True(t, a.LastOKAt.Equal(*at(10)))

	// An older failure does not replace the last one's text.
	record(schema.AgentReach{Reachable: false, Since: *at(15), ErrorAt: at(15), Error: "agent_timeout: stalled"})
	a = endpointRow(t, db, ep.Name)
	require.Equal(t, "agent_auth: 401 Unauthorized", a.LastError)
	require.True(t, a.LastErrorAt.Equal(*at(20)))
}

func TestADatabaseThatIsAwayNeitherHoldsNorFailsAStep(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	rec := &recordings{Executor: db.Pool}
	rec.broken.Store(true)
	r, _ := startRecorder(t, rec, 50*time.Millisecond)
	w := wires[0]
	srv := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
		return agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))}
	})
	x := newExternal(t, w.protocol, srv, func(cfg *agent.ExternalConfig) { cfg.OnOutcome = r.Observe })
	for range 20 {
		st, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.NoError(t, err)
		require.Equal(t, "ok", st.Text)
	}
	require.Zero(t, rec.written.Load())
	require.Zero(t, testenv.Count(t, db.Pool, `SELECT count(*) FROM agent_endpoints`))

	// Once the database is back, the next interval writes the record.
	rec.broken.Store(false)
	rec.waitWritten(t, 1)
	a := endpointRow(t, db, x.Endpoint().Name)
	require.True(t, a.Reachable)
}
