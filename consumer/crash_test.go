package consumer

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestParseCrash(t *testing.T) {
	t.Parallel()
	c, err := parseCrash("")
	require.NoError(t, err)
	require.Nil(t, c, "unset costs nothing")
	c, err = parseCrash("during_model:0.25")
	require.NoError(t, err)
	require.Equal(t, &crasher{point: CrashDuringModel, probability: 0.25}, c)
	_, err = parseCrash("during_lunch")
	require.ErrorContains(t, err, "unknown crash point")
	_, err = parseCrash("after_claim:2")
	require.ErrorContains(t, err, "probability")
	c.at(CrashAfterClaim) // another point: no crash
	c, err = parsePause("before_finalize")
	require.NoError(t, err)
	require.Equal(t, &crasher{point: CrashBeforeFinalize, probability: 1, pause: true}, c)
	_, err = armFromEnv(env(PauseEnv, "during_lunch"))
	require.ErrorContains(t, err, PauseEnv+`="during_lunch": unknown pause point`)
	_, err = armFromEnv(func(string) string { return CrashBeforeFinalize })
	require.ErrorContains(t, err, "not both", "a crash point and a pause point cannot be armed together")
}

// env is a getenv that knows one variable.
func env(name, value string) func(string) string {
	return func(k string) string {
		if k == name {
			return value
		}
		return ""
	}
}

// TestCrashPointsFinishOnceAndNeverRepeatAWrite kills a real `baton
// worker` process at each crash point during a turn that calls the
// side-effecting notify tool, then lets a fresh worker take over: the turn
// completes once, and when the notify had completed, the turn goes on from
// its journal of steps, showing the notify's journaled result, which never
// happens twice.
func TestCrashPointsFinishOnceAndNeverRepeatAWrite(t *testing.T) {
	t.Parallel()
	bin := testenv.BatonBinary(t)
	cases := []struct {
		point   string
		outcome string // "replied" or "error"
	}{
		{CrashBeforeClaim, "replied"},
		{CrashAfterClaim, "replied"},
		{CrashDuringModel, "replied"},
		{CrashAfterTool, "resumed"},
		{CrashBeforeFinalize, "resumed"},
		{CrashAfterFinalizeBeforeAck, "replied"},
	}
	for _, tc := range cases {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.Conversation("c")

			cmd := exec.Command(bin, "worker",
				"--database-url", b.DB.URL,
				"--nats-url", b.NATS.URL,
				"--stream", b.Stream.Name,
				"--subject-prefix", b.Stream.SubjectPrefix,
				"--partitions", strconv.Itoa(b.Stream.Partitions),
				"--lease", "1s", "--ack-wait", "1s", "--debounce", "0", "--echo-directives",
				"--log-format", "json")
			cmd.Env = append(os.Environ(), CrashEnv+"="+tc.point)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			exited := make(chan struct{})
			var waitErr error
			go func() {
				waitErr = cmd.Wait()
				close(exited)
			}()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})

			b.Send("c", "m1", "please\n/tool notify hello")
			select {
			case <-exited:
				var ee *exec.ExitError
				require.True(t, errors.As(waitErr, &ee), "worker ended with %v; stderr:\n%s", waitErr, stderr.String())
				ws := ee.Sys().(syscall.WaitStatus)
				require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the worker dies like SIGKILL at %s; stderr:\n%s", tc.point, stderr.String())
			case <-time.After(60 * time.Second):
				t.Fatalf("the worker did not reach crash point %s; stderr:\n%s", tc.point, stderr.String())
			}

			b.startWorker(b.testConfig())
			b.settled(30 * time.Second)

			replies := b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant'`)
			errs := b.Count(`SELECT count(*) FROM messages WHERE role = 'error'`)
			require.Equal(t, 1, replies, "the turn completes once")
			require.Zero(t, errs)
			require.Equal(t, "done", b.statusOf("m1"))
			var content string
			require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'assistant'`).Scan(&content))
			require.Equal(t, "[notify: notified]\necho: please", content)
			runs := b.Count(`SELECT count(*) FROM agent_runs`)
			if tc.outcome == "resumed" {
				require.Equal(t, 2, runs, "the second run goes on from the first's journal")
				require.Equal(t, 1, b.Count(`SELECT count(*) FROM agent_steps`), "the step with the notify is journaled once")
				require.Equal(t, 1, b.Count(`SELECT count(*) FROM operations o JOIN messages m ON m.id = o.message_id
					WHERE o.tool = 'notify' AND o.status = 'completed' AND m.role = 'assistant'`), "the reply carries the first run's notify")
			}
			require.Equal(t, 1, b.Count(`SELECT count(*) FROM tool_side_effects`), "the side effect happened exactly once")
			require.Zero(t, b.Count(`SELECT count(*) FROM (SELECT operation_id FROM tool_side_effects GROUP BY operation_id HAVING count(*) > 1) d`),
				"no operation executed twice")
		})
	}
}
