// Package proctest runs real child processes for tests: it keeps every
// line a process writes, numbered on its stream, so that a test can wait
// for a line (woken by the line itself, not by polling), show the end of
// the output when something fails and search all of it at the end; and it
// stops a process as systemd does, SIGTERM and then SIGKILL after a grace.
package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrAborted is what AwaitLine returns when its abort channel closes
// first.
var ErrAborted = errors.New("proctest: the wait was aborted")

// Line is one line a process wrote, without its newline.
type Line struct {
	Stream string // stdout or stderr
	N      int    // its number on that stream, from 1
	Text   string
}

// Options set up a process that Start runs. The zero value is ready to
// use.
type Options struct {
	// Mask is applied to each line that a failure message of the
	// process quotes (Tail, AwaitLine, Wait): a test whose processes
	// print secrets masks them. Nil quotes the lines as written.
	Mask func(string) string
	// OnLine, when set, sees each line as it is read, after it is
	// recorded.
	OnLine func(p *Process, l Line)
	// OnExit, when set, is called once the process ended and all its
	// output is read.
	OnExit func(p *Process)
}

// Process is one running or finished child process with every line it
// wrote.
type Process struct {
	// Name says which process it is in messages.
	Name string
	// Cmd is the command it runs; it is not to be changed once started.
	Cmd *exec.Cmd

	opts Options
	done chan struct{}

	mu       sync.Mutex
	lines    []Line
	exitErr  error
	stopping bool
	// changed is closed, and replaced, at every new line and at the exit.
	changed chan struct{}
}

// Start runs cmd, whose Stdout and Stderr it takes over: what it writes
// is read line by line into the Process. Whatever else cmd has (Env, Dir,
// Stdin, SysProcAttr) is as the caller set it.
func Start(name string, cmd *exec.Cmd, opts Options) (*Process, error) {
	p := &Process{Name: name, Cmd: cmd, opts: opts, done: make(chan struct{}), changed: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
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
		if p.opts.OnExit != nil {
			p.opts.OnExit(p)
		}
	}()
	return p, nil
}

func (p *Process) read(stream string, r io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		s, err := br.ReadString('\n')
		if s != "" {
			l := Line{Stream: stream, N: n, Text: strings.TrimSuffix(s, "\n")}
			p.mu.Lock()
			p.lines = append(p.lines, l)
			p.notifyLocked()
			p.mu.Unlock()
			if p.opts.OnLine != nil {
				p.opts.OnLine(p, l)
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Done is closed once the process ended and all its output is read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitStatus is what waiting for the process returned: nil while it runs
// and after it exited 0.
func (p *Process) ExitStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// ExitCode is the process's exit code, once it ended: -1 when a signal
// ended it.
func (p *Process) ExitCode() int { return ExitCode(p.ExitStatus()) }

// ExitCode returns the exit code that err, from waiting for a process,
// stands for: 0 for nil, -1 when it is no exit status.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// Output returns every line the process wrote so far, stdout and stderr
// lines in the order they were read.
func (p *Process) Output() []Line {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Line(nil), p.lines...)
}

// Text returns what the process wrote on stream, or on both for "".
func (p *Process) Text(stream string) string {
	var b strings.Builder
	for _, l := range p.Output() {
		if stream == "" || l.Stream == stream {
			b.WriteString(l.Text + "\n")
		}
	}
	return b.String()
}

// Tail returns the last n lines of the output, indented and masked, for
// a failure message.
func (p *Process) Tail(n int) string {
	lines := p.Output()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + p.mask(l.Text) + "\n")
	}
	return b.String()
}

func (p *Process) mask(s string) string {
	if p.opts.Mask == nil {
		return s
	}
	return p.opts.Mask(s)
}

// tailLines is how much of the output a failure of a wait shows.
const tailLines = 20

// AwaitLine waits until the process writes a line holding every one of
// parts and returns it. It returns an error that shows the end of the
// output when the process ends first or timeout passes, and ErrAborted
// when abort (which may be nil) closes first.
func (p *Process) AwaitLine(abort <-chan struct{}, timeout time.Duration, parts ...string) (string, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		// Taken with the lines, so a line written after the check wakes
		// the wait below.
		changed := p.changed
		lines := append([]Line(nil), p.lines...)
		// The exit is recorded after the last line is read: when it is
		// in the same snapshot, no line is to come.
		exited := p.Exited()
		p.mu.Unlock()
		for _, l := range lines {
			if ContainsAll(l.Text, parts) {
				return l.Text, nil
			}
		}
		if exited {
			return "", fmt.Errorf("%s exited (%v) before writing a line with %q; its last lines:\n%s", p.Name, p.ExitStatus(), parts, p.Tail(tailLines))
		}
		select {
		case <-changed:
		case <-abort:
			return "", ErrAborted
		case <-timer.C:
			return "", fmt.Errorf("%s wrote no line with %q within %s; its last lines:\n%s", p.Name, parts, timeout, p.Tail(tailLines))
		}
	}
}

// WaitLine is AwaitLine that fails t instead of returning an error.
func (p *Process) WaitLine(t testing.TB, timeout time.Duration, parts ...string) string {
	t.Helper()
	line, err := p.AwaitLine(nil, timeout, parts...)
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// AwaitExit waits for the process to end on its own and returns nil, or
// an error that shows the end of the output when timeout passes first;
// the process then still runs.
func (p *Process) AwaitExit(timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("%s did not end within %s; its last lines:\n%s", p.Name, timeout, p.Tail(tailLines))
	}
}

// Wait waits for the process to end on its own and returns its exit code.
// When timeout passes first, it kills the process and fails t.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	if err := p.AwaitExit(timeout); err != nil {
		p.Kill()
		t.Fatal(err)
	}
	return p.ExitCode()
}

// Stop asks the process to shut down with SIGTERM, as systemd does, and
// kills it when it has not ended after grace. It returns once the process
// ended.
func (p *Process) Stop(grace time.Duration) {
	p.markStopping()
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// Kill kills the process with SIGKILL and returns once it ended.
func (p *Process) Kill() {
	p.markStopping()
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *Process) markStopping() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
}

// Stopping reports whether Stop or Kill was called: whether an exit of
// the process was asked for.
func (p *Process) Stopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// ContainsAll reports whether s holds every one of parts.
func ContainsAll(s string, parts []string) bool {
	for _, part := range parts {
		if !strings.Contains(s, part) {
			return false
		}
	}
	return true
}

// Group is the processes of one test, to search their output together
// and stop them all at its end. The zero value is ready to use.
type Group struct {
	mu      sync.Mutex
	all     []*Process
	stopped bool
}

// Start starts a process, as Start does, as one of the group's. Once
// StopAll was called, it starts nothing and returns an error.
func (g *Group) Start(name string, cmd *exec.Cmd, opts Options) (*Process, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil, fmt.Errorf("start %s: the processes are stopping", name)
	}
	p, err := Start(name, cmd, opts)
	if err != nil {
		return nil, err
	}
	g.all = append(g.all, p)
	return p, nil
}

// All returns the group's processes, in the order they started.
func (g *Group) All() []*Process {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Process(nil), g.all...)
}

// StopAll stops every process of the group that still runs, all at once,
// each as Stop does with grace, and returns once all ended. The group
// starts nothing after it.
func (g *Group) StopAll(grace time.Duration) {
	g.mu.Lock()
	g.stopped = true
	all := append([]*Process(nil), g.all...)
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(grace)
		}()
	}
	wg.Wait()
}
