package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/netns"
)

// process is one supervised OS process of the system under test: a baton
// subcommand with fixed arguments. While supervised, an exit the harness did
// not cause is counted and the process is started again after a second;
// a fault takes the process out of supervision, kills it and hands it back.
type process struct {
	name    string
	bin     string
	args    []string
	logPath string
	// node is the network namespace the process runs in.
	node *netns.Node
	// baseEnv is added to the environment of every start.
	baseEnv []string

	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	exit       error
	env        []string
	supervised bool
	closed     bool
	logStart   int64

	// unexpected counts exits nobody asked for.
	unexpected atomic.Int64
	starts     atomic.Int64
}

func newProcess(name, bin, logPath string, args ...string) *process {
	done := make(chan struct{})
	close(done)
	return &process{name: name, bin: bin, args: args, logPath: logPath, done: done}
}

// start launches the process with extra environment, unless it runs.
func (p *process) start(env ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked(env)
}

func (p *process) startLocked(env []string) error {
	if p.closed {
		return errors.New(p.name + ": harness is shutting down")
	}
	select {
	case <-p.done:
	default:
		return nil // running
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	st, _ := logf.Stat()
	bin, args := p.bin, p.args
	if p.node != nil {
		bin, args = p.node.Command(p.bin, p.args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), p.baseEnv...), env...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Its own process group, so a terminal's Ctrl-C reaches only the
	// harness, which then stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.starts.Add(1)
	done := make(chan struct{})
	p.cmd, p.done, p.env, p.exit = cmd, done, env, nil
	if st != nil {
		p.logStart = st.Size()
	}
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.exit = err
		close(done)
		restart := p.supervised && !p.closed && p.cmd == cmd
		p.mu.Unlock()
		if restart {
			p.unexpected.Add(1)
			time.AfterFunc(time.Second, func() {
				p.mu.Lock()
				defer p.mu.Unlock()
				if p.supervised && p.cmd == cmd {
					_ = p.startLocked(nil)
				}
			})
		}
	}()
	return nil
}

// supervise starts the process if needed and restarts it after exits
// nobody asked for.
func (p *process) supervise() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.supervised = true
	return p.startLocked(nil)
}

// take ends supervision, so that a fault may kill the process and decide
// when it comes back.
func (p *process) take() {
	p.mu.Lock()
	p.supervised = false
	p.mu.Unlock()
}

// running reports whether the process is alive.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited is closed when the current process ends.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// exitStatus is how the last process ended.
func (p *process) exitStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	p.signal(syscall.SIGKILL, 0)
}

// stop asks the process to shut down, and kills it after grace.
func (p *process) stop(grace time.Duration) {
	p.signal(syscall.SIGTERM, grace)
}

func (p *process) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	<-done
}

// close ends supervision for good and stops the process.
func (p *process) close(grace time.Duration) {
	p.mu.Lock()
	p.supervised = false
	p.closed = true
	p.mu.Unlock()
	p.stop(grace)
}

// logSince returns what the current process wrote to its log.
func (p *process) logSince() string {
	p.mu.Lock()
	start := p.logStart
	p.mu.Unlock()
	b, err := os.ReadFile(p.logPath)
	if err != nil || int64(len(b)) < start {
		return ""
	}
	return string(b[start:])
}

// logged reports whether the current process logged s.
func (p *process) logged(s string) bool {
	return strings.Contains(p.logSince(), s)
}

// waitLogged polls the log of the current process for s, until within ends
// or the process exits.
func (p *process) waitLogged(s string, within time.Duration) error {
	deadline := time.Now().Add(within)
	done := p.exited()
	for {
		if p.logged(s) {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before logging %q: %v\n%s", p.name, s, p.exitStatus(), tailOf(p.logSince(), 15))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not log %q within %s\n%s", p.name, s, within, tailOf(p.logSince(), 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady polls the log of the supervised process for s, across the
// restarts of a process that exits while it starts (such as a worker that
// finds the cluster not ready yet), until within ends.
func (p *process) waitReady(s string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if p.running() && p.logged(s) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not log %q within %s (%d starts); last output:\n%s", p.name, s, within, p.starts.Load(), tailOf(p.logSince(), 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killedBySignal reports whether err is the exit of a SIGKILLed process.
func killedBySignal(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
