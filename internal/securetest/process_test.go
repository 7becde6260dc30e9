package securetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/proctest"
	"github.com/batonhq/baton/internal/testenv"
)

// timeline logs each step of a test with the time since the test began,
// so that a slow or failed run shows where its time went.
func timeline(t *testing.T) func(step string) {
	began := time.Now()
	return func(step string) {
		t.Helper()
		t.Logf("%6.1fs %s", time.Since(began).Seconds(), step)
	}
}

type (
	// process is one running or finished baton process.
	process = proctest.Process
	// outputLine is one line a process wrote.
	outputLine = proctest.Line
)

// processes runs the baton processes of one test and keeps every byte
// they write, so that the test can wait for what they print and search all
// of it for secrets at the end.
type processes struct {
	bin   string
	group proctest.Group
}

func newProcesses(t *testing.T) *processes {
	ps := &processes{bin: testenv.PlainBatonBinary(t)}
	// On a failure, whatever still runs is stopped, and the end of each
	// process's output shown (the secrets of these tests are throwaway).
	t.Cleanup(func() {
		ps.stopAll()
		if !t.Failed() {
			return
		}
		for _, p := range ps.group.All() {
			t.Logf("%s (%v) wrote, last lines:\n%s", p.Name, p.ExitStatus(), p.Tail(25))
		}
	})
	return ps
}

// baseEnv is this process's environment without anything that would
// configure baton or its database driver behind the test's back: only
// what the test gives a process reaches it.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BATON_") || strings.HasPrefix(k, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// start runs `baton args...` with env (KEY=VALUE) added to a clean
// environment. name says which process it is in failures. t is the test
// (or subtest) that runs it; the process belongs to the test of ps.
func (ps *processes) start(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(ps.bin, args...)
	cmd.Env = append(baseEnv(), env...)
	p, err := ps.group.Start(name, cmd, proctest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs `baton args...` to its end, within timeout, and returns its
// exit code.
func (ps *processes) run(t *testing.T, name string, timeout time.Duration, env []string, args ...string) (*process, int) {
	t.Helper()
	p := ps.start(t, name, env, args...)
	return p, p.Wait(t, timeout)
}

// stopAll stops every process that still runs, all at once, and waits for
// them: their shutdown output is part of what is searched for secrets.
func (ps *processes) stopAll() { ps.group.StopAll(15 * time.Second) }

// requireNoLine fails t when any process's output holds a line with all
// of parts, in any case, naming the process and the line.
func (ps *processes) requireNoLine(t *testing.T, why string, parts ...string) {
	t.Helper()
	var lower []string
	for _, part := range parts {
		lower = append(lower, strings.ToLower(part))
	}
	for _, p := range ps.group.All() {
		for _, l := range p.Output() {
			if proctest.ContainsAll(strings.ToLower(l.Text), lower) {
				t.Errorf("%s, but %s wrote, %s line %d:\n    %s", why, p.Name, l.Stream, l.N, l.Text)
			}
		}
	}
}
