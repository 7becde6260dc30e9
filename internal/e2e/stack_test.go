package e2e_test

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
)

// processStack is Baton as real processes, each of this tree's binary:
// the relay and the API over a fresh PostgreSQL database and a NATS
// server; workers are started by the test.
type processStack struct {
	t       testing.TB
	db      *testenv.DB
	bin     string
	natsURL string
	apiAddr string
	api     *proctest.Process
}

func startProcessStack(t testing.TB) *processStack {
	t.Helper()
	testenv.StartPlainBatonBuild()
	s := &processStack{t: t, db: testenv.Database(t), natsURL: testenv.StartNATS(t).URL}
	s.bin = testenv.PlainBatonBinary(t)
	port, err := pgcluster.FreePort()
	require.NoError(t, err)
	s.apiAddr = fmt.Sprintf("127.0.0.1:%d", port)
	s.start("relay", "relay", "--database-url", s.db.URL, "--nats-url", s.natsURL, "--slot", "baton_"+s.db.Name).
		WaitLine(t, time.Minute, "connected; streaming")
	s.startAPI()
	return s
}

func (s *processStack) start(name string, args ...string) *proctest.Process {
	s.t.Helper()
	cmd := exec.Command(s.bin, append(args, "--log-format", "json")...)
	p, err := proctest.Start(name, cmd, proctest.Options{})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { p.Stop(10 * time.Second) })
	return p
}

// startAPI starts `baton api` on the stack's API address (again, after
// the last one was killed).
func (s *processStack) startAPI() {
	s.t.Helper()
	s.api = s.start("api", "api", "--database-url", s.db.URL, "--nats-url", s.natsURL, "--http-addr", s.apiAddr,
		"--messages-per-minute", "100000", "--message-burst", "10000", "--max-streams-per-user", "1000")
	s.api.WaitLine(s.t, time.Minute, "serving HTTP API")
}

// startWorker starts a worker whose agent is the model server at baseURL.
func (s *processStack) startWorker(baseURL string, args ...string) *proctest.Process {
	s.t.Helper()
	w := s.start("worker", append([]string{"worker", "--database-url", s.db.URL, "--nats-url", s.natsURL,
		"--agent", "openai", "--model-base-url", baseURL, "--model", "test"}, args...)...)
	w.WaitLine(s.t, time.Minute, "worker started")
	return w
}
