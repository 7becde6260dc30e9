package consumer

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
)

// workerProcesses starts n real `baton worker` processes with default
// settings (the 30 s lease among them) on the bundle's database and
// stream, and waits until each holds its session.
func (b *bundle) workerProcesses(t testing.TB, n int, extra ...string) []*proctest.Process {
	t.Helper()
	bin := testenv.BatonBinary(t)
	var g proctest.Group
	t.Cleanup(func() { g.StopAll(5 * time.Second) })
	var out []*proctest.Process
	for i := range n {
		args := []string{"worker",
			"--database-url", b.DB.URL,
			"--nats-url", b.NATS.URL,
			"--stream", b.Stream.Name,
			"--subject-prefix", b.Stream.SubjectPrefix,
			"--partitions", strconv.Itoa(b.Stream.Partitions),
			"--echo-directives", "--log-format", "json"}
		p, err := g.Start(fmt.Sprintf("worker%d", i+1), exec.Command(bin, append(args, extra...)...), proctest.Options{})
		require.NoError(t, err)
		p.WaitLine(t, 60*time.Second, "worker started")
		if !slices.Contains(extra, "--no-session") {
			p.WaitLine(t, 30*time.Second, "worker session held")
		}
		out = append(out, p)
	}
	return out
}

// trustSessions records that workers have held their sessions on this
// server for a while, as they have on any database in use: free locks
// count from the start instead of ten seconds after the first worker took
// its lock (the grace that covers a restart, tested in schema).
func (b *bundle) trustSessions(t testing.TB) {
	t.Helper()
	_, err := b.DB.Pool.Exec(context.Background(), `
		INSERT INTO worker_session_epochs (server_started_at, first_session_at)
		VALUES (pg_postmaster_start_time(), now() - interval '1 minute')`)
	require.NoError(t, err)
}

// killMidTurn sends a long turn to each of conversations, waits until all
// of them run, SIGKILLs the worker that holds the most of them, and
// returns how long each of its conversations waited from the kill to the
// start of its next turn.
func (b *bundle) killMidTurn(t testing.TB, workers []*proctest.Process, conversations []string, tag string) []time.Duration {
	t.Helper()
	return b.stopMidTurn(t, workers, conversations, tag, 20*time.Second, func(p *proctest.Process) time.Time {
		killed := time.Now()
		p.Kill()
		return killed
	})
}

// stopMidTurn is killMidTurn with turns that take turn, and stop, which
// ends the worker and returns the moment the delays count from. Only the
// turns of conversations count: the worker that runs the most of them is
// stopped.
func (b *bundle) stopMidTurn(t testing.TB, workers []*proctest.Process, conversations []string, tag string, turn time.Duration, stop func(*proctest.Process) time.Time) []time.Duration {
	t.Helper()
	ctx := context.Background()
	for _, c := range conversations {
		b.Send(c, c+"-"+tag, "a long one\n/sleep "+turn.String())
	}
	b.Eventually(30*time.Second, func() bool {
		return b.Count(`SELECT count(*) FROM agent_runs r JOIN agent_outbox o ON o.id = ANY (r.outbox_ids)
			WHERE r.status = 'running' AND o.message_id IN (SELECT id FROM messages WHERE public_id LIKE '%-' || $1)`, tag) == len(conversations)
	}, "every conversation's turn runs")
	keys := make([]string, len(conversations))
	for i, c := range conversations {
		keys[i] = b.Key(c)
	}
	// The worker names end in their process ids.
	held := map[int][]string{}
	rows, err := b.DB.Pool.Query(ctx, `SELECT worker, conversation_id FROM agent_runs WHERE status = 'running' AND conversation_id = ANY($1)`, keys)
	require.NoError(t, err)
	for rows.Next() {
		var worker, conv string
		require.NoError(t, rows.Scan(&worker, &conv))
		held[pidOf(worker)] = append(held[pidOf(worker)], conv)
	}
	require.NoError(t, rows.Err())
	victim := workers[0]
	for _, w := range workers {
		if len(held[w.Cmd.Process.Pid]) > len(held[victim.Cmd.Process.Pid]) {
			victim = w
		}
	}
	affected := held[victim.Cmd.Process.Pid]
	require.NotEmpty(t, affected, "the worker to kill runs turns")
	killed := stop(victim)

	delays := make([]time.Duration, len(affected))
	b.Eventually(60*time.Second, func() bool {
		for i, conv := range affected {
			var started *time.Time
			require.NoError(t, b.DB.Pool.QueryRow(ctx, `
				SELECT min(started_at) FROM agent_runs WHERE conversation_id = $1 AND started_at > $2`, conv, killed).Scan(&started))
			if started == nil {
				return false
			}
			delays[i] = started.Sub(killed)
		}
		return true
	}, "each conversation of the killed worker starts its next turn")
	return delays
}

// benchTurn is how long the turns that BenchmarkKillToNextTurn kills take:
// long enough that all four run when the kill comes.
const benchTurn = 5 * time.Second

// pidOf reads the process id at the end of a worker's default name,
// <host>-<pid>.
func pidOf(name string) int {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	pid, _ := strconv.Atoi(name[i:])
	return pid
}

// TestAKilledWorkersConversationsStartTheirNextTurnWithinTwoSeconds: two
// real workers with default settings (a 30 s lease and ack wait) run long
// turns; one is SIGKILLed mid-turn. Its session's lock goes with its
// connection, so the other worker recovers its runs and announces them
// again at once, and every conversation it held starts its next turn
// within two seconds, not after the lease.
func TestAKilledWorkersConversationsStartTheirNextTurnWithinTwoSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.trustSessions(t)
	workers := b.workerProcesses(t, 2)
	var conversations []string
	for i := range 6 {
		c := fmt.Sprintf("c%d", i)
		b.Conversation(c)
		conversations = append(conversations, c)
	}
	delays := b.killMidTurn(t, workers, conversations, "m1")
	for _, d := range delays {
		require.Less(t, d, 2*time.Second, "every conversation of the killed worker starts its next turn within 2s of the kill, with the 30s lease: %v", delays)
	}
}

// TestAWorkerStoppedMidTurnHandsItsTurnsBackAtOnce: SIGTERM during turns
// longer than the shutdown grace (10 s): the worker gives them up when
// the grace ends and exits 0, and the other worker starts each of them
// within a second of that (measured from the SIGTERM: within 11 s), not
// after the 30 s lease.
func TestAWorkerStoppedMidTurnHandsItsTurnsBackAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.trustSessions(t)
	workers := b.workerProcesses(t, 2)
	var conversations []string
	for i := range 4 {
		c := fmt.Sprintf("c%d", i)
		b.Conversation(c)
		conversations = append(conversations, c)
	}
	delays := b.stopMidTurn(t, workers, conversations, "m1", 20*time.Second, func(p *proctest.Process) time.Time {
		stopped := time.Now()
		require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, p.AwaitExit(30*time.Second), "the worker stops within its shutdown grace")
		require.Zero(t, p.ExitCode(), "a graceful stop exits 0")
		p.WaitLine(t, time.Second, "turn given up at shutdown")
		return stopped
	})
	for _, d := range delays {
		require.Less(t, d, DefaultShutdownTimeout+time.Second,
			"each turn the stopped worker gave up when its 10s grace ended starts on the other worker within a second of that: %v", delays)
	}
}

// BenchmarkKillToNextTurn measures, over b.N SIGKILLs of one of two real
// workers with default settings, how long each conversation the killed
// worker held waits from the kill to the start of its next turn: with the
// worker's session (the default), and with the lease alone (--no-session,
// the reference). Each kill's worker is started again before the next.
// Run with -benchtime 20x; the reference takes the lease (30 s) per kill.
//
// Each kill hits turns of four fresh conversations, which sleep benchTurn,
// and the next kill waits until they have ended on the other worker: an
// earlier version killed the same conversations' turns again and again,
// the surviving worker's retries among them, until their third attempt
// failed them visibly and their next turn never came.
func BenchmarkKillToNextTurn(b *testing.B) {
	for _, mode := range []struct {
		name  string
		extra []string
	}{{"session", nil}, {"lease_alone", []string{"--no-session"}}} {
		b.Run(mode.name, func(b *testing.B) {
			bb := setup(b)
			bb.trustSessions(b)
			workers := bb.workerProcesses(b, 2, mode.extra...)
			var delays []time.Duration
			for i := range b.N {
				var convs []string
				for j := range 4 {
					c := fmt.Sprintf("k%d-c%d", i, j)
					bb.Conversation(c)
					convs = append(convs, c)
				}
				d := bb.stopMidTurn(b, workers, convs, fmt.Sprintf("m%d", i), benchTurn, func(p *proctest.Process) time.Time {
					killed := time.Now()
					p.Kill()
					return killed
				})
				delays = append(delays, d...)
				// The killed worker comes back, as a supervisor would start it.
				for k, w := range workers {
					if w.Exited() {
						workers[k] = bb.workerProcesses(b, 1, mode.extra...)[0]
					}
				}
				// The turns taken over end before the next kill, so that
				// every kill hits turns of its own, each at its first
				// attempt, and none is killed twice into its attempt cap.
				bb.Eventually(2*time.Minute, func() bool {
					return bb.Count(`SELECT count(*) FROM agent_outbox WHERE status NOT IN ('done', 'error')`) == 0
				}, "the turns of kill %d end", i)
			}
			slices.Sort(delays)
			p := func(q float64) float64 { return delays[int(q*float64(len(delays)-1))].Seconds() * 1000 }
			b.ReportMetric(p(0.5), "p50-ms")
			b.ReportMetric(p(0.99), "p99-ms")
			b.ReportMetric(float64(len(delays)), "conversations")
			b.Logf("%s: %d kills, %d conversations, kill to next turn p50 %.0f ms, p99 %.0f ms, max %.0f ms",
				mode.name, b.N, len(delays), p(0.5), p(0.99), delays[len(delays)-1].Seconds()*1000)
		})
	}
}
