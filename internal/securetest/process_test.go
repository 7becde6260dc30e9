package securetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
)

// batonBinary returns the baton binary the tests run, built once for the
// package without the race detector whatever the tests run with: these
// tests run dozens of processes on a machine other tests share, and judge
// them by what they do and print, not by races inside one of them (the
// packages' own tests run with -race). It is the build the chaos harness
// makes, so one of them finds it in the build cache.
// BATON_TEST_BINARY names a prebuilt binary instead.
func batonBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	buildBinary()
	if binaryErr != nil {
		t.Fatalf("build baton: %v", binaryErr)
	}
	return binaryPath
}

// startBuild starts building the binary in the background, so that a
// test's other setup (a NATS cluster, PostgreSQL) overlaps with it.
func startBuild() {
	if os.Getenv("BATON_TEST_BINARY") == "" {
		go buildBinary()
	}
}

func buildBinary() {
	binaryOnce.Do(func() {
		binaryDir, binaryErr = os.MkdirTemp("", "baton-securetest-")
		if binaryErr != nil {
			return
		}
		binaryPath = filepath.Join(binaryDir, "baton")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", binaryPath, "./cmd/baton")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			binaryErr = fmt.Errorf("go build ./cmd/baton: %w\n%s", err, out)
		}
	})
}

// timeline logs each step of a test with the time since the test began,
// so that a slow or failed run shows where its time went.
func timeline(t *testing.T) func(step string) {
	began := time.Now()
	return func(step string) {
		t.Helper()
		t.Logf("%6.1fs %s", time.Since(began).Seconds(), step)
	}
}

// removeBinary removes the binary once no build runs any more.
func removeBinary() {
	binaryOnce.Do(func() {})
	if binaryDir != "" {
		_ = os.RemoveAll(binaryDir)
	}
}

// processes runs the baton processes of one test and keeps every byte
// they write, so that the test can wait for what they print and search all
// of it for secrets at the end.
type processes struct {
	bin string

	mu  sync.Mutex
	all []*process
}

func newProcesses(t *testing.T) *processes {
	ps := &processes{bin: batonBinary(t)}
	// On a failure, whatever still runs is stopped, and the end of each
	// process's output shown (the secrets of these tests are throwaway).
	t.Cleanup(func() {
		ps.stopAll()
		if !t.Failed() {
			return
		}
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, p := range ps.all {
			t.Logf("%s (%v) wrote, last lines:\n%s", p.name, p.exitStatus(), p.tail(25))
		}
	})
	return ps
}

// outputLine is one line a process wrote.
type outputLine struct {
	stream string // stdout or stderr
	n      int    // its number on that stream, from 1
	text   string
}

// process is one running or finished baton process.
type process struct {
	name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []outputLine
	exitErr error
	done    chan struct{}
	// changed is closed, and replaced, at every new line and at the exit.
	changed chan struct{}
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
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), changed: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Add(2)
	go p.read("stdout", stdout, &readers)
	go p.read("stderr", stderr, &readers)
	go func() {
		// Every byte is read before Wait closes the pipes.
		readers.Wait()
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		close(p.done)
		p.notifyLocked()
		p.mu.Unlock()
	}()
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	return p
}

// run runs `baton args...` to its end, within timeout, and returns its
// exit code.
func (ps *processes) run(t *testing.T, name string, timeout time.Duration, env []string, args ...string) (*process, int) {
	t.Helper()
	p := ps.start(t, name, env, args...)
	return p, p.wait(t, timeout)
}

func (p *process) read(stream string, r io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		s, err := br.ReadString('\n')
		if s != "" {
			p.mu.Lock()
			p.lines = append(p.lines, outputLine{stream: stream, n: n, text: strings.TrimSuffix(s, "\n")})
			p.notifyLocked()
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (p *process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// output returns everything the process wrote so far, stdout and stderr
// lines in the order they were read.
func (p *process) output() []outputLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outputLine(nil), p.lines...)
}

// text returns what the process wrote on stream ("" for both).
func (p *process) text(stream string) string {
	var b strings.Builder
	for _, l := range p.output() {
		if stream == "" || l.stream == stream {
			b.WriteString(l.text + "\n")
		}
	}
	return b.String()
}

// tail returns the last n lines of the output, indented, for failures.
func (p *process) tail(n int) string {
	lines := p.output()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + l.text + "\n")
	}
	return b.String()
}

// waitLine waits until the process writes a line holding every one of
// parts and returns it. It fails t when the process ends first or timeout
// passes.
func (p *process) waitLine(t *testing.T, timeout time.Duration, parts ...string) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		// Taken with the lines, so a line written after the check wakes
		// the wait below.
		changed := p.changed
		lines := append([]outputLine(nil), p.lines...)
		exited := p.exited()
		p.mu.Unlock()
		for _, l := range lines {
			if containsAll(l.text, parts) {
				return l.text
			}
		}
		if exited {
			t.Fatalf("%s exited (%v) before printing a line with %q; its output:\n%s", p.name, p.exitStatus(), parts, p.tail(20))
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("%s printed no line with %q within %s; its output:\n%s", p.name, parts, timeout, p.tail(20))
		}
	}
}

func containsAll(s string, parts []string) bool {
	for _, part := range parts {
		if !strings.Contains(s, part) {
			return false
		}
	}
	return true
}

func (p *process) exitStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// wait waits for the process to end on its own and returns its exit code.
// It fails t, after killing the process, when timeout passes first.
func (p *process) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.signal(syscall.SIGKILL, 0)
		t.Fatalf("%s did not end within %s; its output:\n%s", p.name, timeout, p.tail(20))
	}
	return exitCode(p.exitStatus())
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// stop asks the process to shut down (SIGTERM, as systemd does) and kills
// it when it has not ended after grace.
func (p *process) stop(grace time.Duration) { p.signal(syscall.SIGTERM, grace) }

func (p *process) signal(sig syscall.Signal, grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-p.done:
			return
		case <-time.After(grace):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	<-p.done
}

// stopAll stops every process that still runs, all at once, and waits for
// them: their shutdown output is part of what is searched for secrets.
func (ps *processes) stopAll() {
	ps.mu.Lock()
	all := append([]*process(nil), ps.all...)
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(15 * time.Second)
		}()
	}
	wg.Wait()
}

// requireNoLine fails t when any process's output holds a line with all
// of parts, in any case, naming the process and the line.
func (ps *processes) requireNoLine(t *testing.T, why string, parts ...string) {
	t.Helper()
	var lower []string
	for _, part := range parts {
		lower = append(lower, strings.ToLower(part))
	}
	ps.mu.Lock()
	all := append([]*process(nil), ps.all...)
	ps.mu.Unlock()
	for _, p := range all {
		for _, l := range p.output() {
			if containsAll(strings.ToLower(l.text), lower) {
				t.Errorf("%s, but %s wrote, %s line %d:\n    %s", why, p.name, l.stream, l.n, l.text)
			}
		}
	}
}
