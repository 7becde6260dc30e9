package relay

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// relayProcess is a real `baton relay` process.
type relayProcess struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

func (p *relayProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *relayProcess) logged(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Contains(p.logs.String(), s)
}

func (p *relayProcess) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (b *bundle) startProcess(t *testing.T, args ...string) *relayProcess {
	t.Helper()
	bin := testenv.BatonBinary(t)
	args = append([]string{"relay",
		"--database-url", b.dbURL,
		"--nats-url", b.nats.URL,
		"--slot", b.cfg.Slot,
		"--log-format", "json",
		"--heartbeat", "200ms",
	}, args...)
	p := &relayProcess{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout = p
	p.cmd.Stderr = p
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("baton relay output:\n%s", p)
		}
	})
	return p
}

func (p *relayProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
}

func (p *relayProcess) waitLogged(t *testing.T, s string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return p.logged(s) }, within, 10*time.Millisecond, "baton relay did not log %q", s)
}

func TestRelayKilledBetweenPublishAndConfirmLosesAndDoublesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.conversation(t, "killed")
	// A status interval far beyond the test: the first relay publishes
	// and never confirms.
	first := b.startProcess(t, "--status-interval", "50s")
	first.waitLogged(t, "connected; streaming", time.Minute)
	var ids []int64
	for i := range 200 {
		ids = append(ids, b.insert(t, "killed", fmt.Sprintf("killed-%d", i)))
	}
	end := currentLSN(t, b.pool)
	waitStreamCount(t, b.js, len(ids), time.Minute)
	require.Less(t, slotConfirmed(t, b.pool, b.cfg.Slot), end, "the relay must be killed after publishing and before confirming")
	first.kill(t)

	for i := 200; i < 300; i++ {
		ids = append(ids, b.insert(t, "killed", fmt.Sprintf("killed-%d", i)))
	}
	end = currentLSN(t, b.pool)
	second := b.startProcess(t, "--status-interval", "100ms")
	second.waitLogged(t, "connected; streaming", time.Minute)
	waitStreamCount(t, b.js, len(ids), time.Minute)
	// Once the slot has moved past every row, nothing more will come.
	waitConfirmedPast(t, b.pool, b.cfg.Slot, end, time.Minute)
	requireExactlyOnce(t, streamEvents(t, b.js), ids)
}

func TestStandbyRelayTakesOverWithinFiveSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.startProcess(t, "--status-interval", "100ms")
	first.waitLogged(t, "connected; streaming", time.Minute)
	second := b.startProcess(t, "--status-interval", "100ms")
	second.waitLogged(t, "standby", time.Minute)

	p := startProducer(t, b, "takeover", 5*time.Millisecond)
	p.waitRows(t, 100)
	waitStreamCount(t, b.js, 50, 30*time.Second)
	first.kill(t)
	killed := time.Now()
	second.waitLogged(t, "took over", 5*time.Second)
	took := time.Since(killed)
	t.Logf("standby took over %s after the first relay was killed", took)
	require.Less(t, took, 5*time.Second)

	p.waitRows(t, p.count()+100)
	p.halt()
	waitStreamCount(t, b.js, p.count(), time.Minute)
	requireExactlyOnce(t, streamEvents(t, b.js), p.ids)
}
