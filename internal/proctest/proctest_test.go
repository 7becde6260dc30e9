package proctest_test

import (
	"errors"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/proctest"
)

func sh(script string) *exec.Cmd { return exec.Command("/bin/sh", "-c", script) }

func TestLinesAreNumberedOnTheirStreamAndTheExitCodeKept(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []proctest.Line
	)
	exited := make(chan bool, 1)
	p, err := proctest.Start("sh", sh(`echo one; echo two >&2; echo three; printf 'no newline'; exit 3`), proctest.Options{
		OnLine: func(_ *proctest.Process, l proctest.Line) {
			mu.Lock()
			seen = append(seen, l)
			mu.Unlock()
		},
		OnExit: func(p *proctest.Process) { exited <- p.Exited() },
	})
	require.NoError(t, err)
	require.Equal(t, 3, p.Wait(t, 30*time.Second))
	require.True(t, <-exited, "OnExit runs once the process ended")

	var exit *exec.ExitError
	require.True(t, errors.As(p.ExitStatus(), &exit), "the exit status is what waiting returned: %v", p.ExitStatus())
	require.Equal(t, "one\nthree\nno newline\n", p.Text("stdout"))
	require.Equal(t, "two\n", p.Text("stderr"))
	require.Len(t, p.Text(""), len("one\nthree\nno newline\ntwo\n"), "both streams, every line")
	byText := map[string]proctest.Line{}
	for _, l := range p.Output() {
		byText[l.Text] = l
	}
	require.Equal(t, proctest.Line{Stream: "stdout", N: 2, Text: "three"}, byText["three"])
	require.Equal(t, proctest.Line{Stream: "stderr", N: 1, Text: "two"}, byText["two"])
	require.Equal(t, proctest.Line{Stream: "stdout", N: 3, Text: "no newline"}, byText["no newline"])
	mu.Lock()
	require.ElementsMatch(t, p.Output(), seen, "OnLine sees every line")
	mu.Unlock()
}

func TestAwaitLineIsWokenByTheLine(t *testing.T) {
	t.Parallel()
	// The process writes the line only once it reads its input: the wait
	// starts before the line exists.
	cmd := sh(`read go; echo "ready at port 4222"; read end || true`)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	p, err := proctest.Start("sh", cmd, proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { p.Kill() })

	got := make(chan string, 1)
	go func() {
		line, err := p.AwaitLine(nil, 30*time.Second, "ready", "4222")
		if err != nil {
			line = err.Error()
		}
		got <- line
	}()
	_, err = in.Write([]byte("go\n"))
	require.NoError(t, err)
	require.Equal(t, "ready at port 4222", <-got)
	require.Equal(t, "ready at port 4222", p.WaitLine(t, time.Second, "ready"), "a line already written is found at once")

	require.NoError(t, in.Close())
	require.Equal(t, 0, p.Wait(t, 30*time.Second))
}

func TestAwaitLineFailsWhenTheProcessEndsTimesOutOrIsAborted(t *testing.T) {
	t.Parallel()
	p, err := proctest.Start("secretive", sh(`echo "the key is s3cret"; exit 2`), proctest.Options{
		Mask: func(s string) string { return strings.ReplaceAll(s, "s3cret", "[masked]") },
	})
	require.NoError(t, err)
	_, err = p.AwaitLine(nil, 30*time.Second, "never written")
	require.Error(t, err)
	require.Contains(t, err.Error(), "secretive exited (exit status 2) before writing a line with")
	require.Contains(t, err.Error(), "    the key is [masked]\n", "the failure shows the end of the output, masked")
	require.NotContains(t, err.Error(), "s3cret")

	cmd := sh(`echo started; read end || true`)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	running, err := proctest.Start("running", cmd, proctest.Options{})
	require.NoError(t, err)
	running.WaitLine(t, 30*time.Second, "started")
	_, err = running.AwaitLine(nil, 10*time.Millisecond, "never written")
	require.ErrorContains(t, err, "running wrote no line with [\"never written\"] within 10ms")
	abort := make(chan struct{})
	close(abort)
	_, err = running.AwaitLine(abort, time.Minute, "never written")
	require.ErrorIs(t, err, proctest.ErrAborted)
	require.ErrorContains(t, running.AwaitExit(10*time.Millisecond), "running did not end within 10ms")
	require.False(t, running.Exited(), "AwaitExit leaves a process that runs on running")

	require.NoError(t, in.Close())
	require.NoError(t, running.AwaitExit(30*time.Second))
	require.Equal(t, 0, running.ExitCode())
}

func TestStopSendsSIGTERMAndKillsAfterTheGrace(t *testing.T) {
	t.Parallel()
	// One that ends on SIGTERM.
	polite, err := proctest.Start("polite", sh(`trap 'kill $!; echo terminated; exit 0' TERM; sleep 600 >/dev/null 2>&1 & echo ready; wait`), proctest.Options{})
	require.NoError(t, err)
	polite.WaitLine(t, 30*time.Second, "ready")
	require.False(t, polite.Stopping())
	polite.Stop(time.Minute)
	require.True(t, polite.Exited())
	require.True(t, polite.Stopping())
	require.Equal(t, 0, polite.ExitCode(), "it ended on its own, on SIGTERM:\n%s", polite.Tail(5))
	require.Equal(t, "terminated\n", polite.Text("stdout")[len("ready\n"):])

	// One that ignores SIGTERM.
	stubborn, err := proctest.Start("stubborn", sh(`trap '' TERM; echo ready; exec sleep 600`), proctest.Options{})
	require.NoError(t, err)
	stubborn.WaitLine(t, 30*time.Second, "ready")
	stubborn.Stop(100 * time.Millisecond)
	var exit *exec.ExitError
	require.True(t, errors.As(stubborn.ExitStatus(), &exit), "%v", stubborn.ExitStatus())
	status := exit.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL, "SIGKILL ends it after the grace: %v", stubborn.ExitStatus())
	require.Equal(t, -1, stubborn.ExitCode())
	stubborn.Stop(time.Minute) // a stopped process stops again at once
}

func TestAGroupStopsEveryProcessAndStartsNoneAfter(t *testing.T) {
	t.Parallel()
	var g proctest.Group
	var ps []*proctest.Process
	for _, name := range []string{"a", "b", "c"} {
		p, err := g.Start(name, sh(`echo ready; exec sleep 600`), proctest.Options{})
		require.NoError(t, err)
		p.WaitLine(t, 30*time.Second, "ready")
		ps = append(ps, p)
	}
	require.Equal(t, ps, g.All())
	g.StopAll(30 * time.Second)
	for _, p := range ps {
		require.True(t, p.Exited(), p.Name)
	}
	_, err := g.Start("late", sh(`exit 0`), proctest.Options{})
	require.ErrorContains(t, err, "start late: the processes are stopping")
	require.Len(t, g.All(), 3)

	_, err = proctest.Start("missing", exec.Command("/nonexistent/binary"), proctest.Options{})
	require.ErrorContains(t, err, "start missing:")
}
