package systemd_test

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
	"time"
)

var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
	binaryDone = make(chan struct{})
)

// startBuild builds the baton binary once, in the background, so that the
// servers start meanwhile. It is built without the race detector whatever
// the tests run with, as the other tests that run Baton's processes build
// it: a dozen processes share the machine, and they are judged by what
// they do and print. BATON_TEST_BINARY names a prebuilt binary instead.
func startBuild() {
	go binaryOnce.Do(func() {
		defer close(binaryDone)
		if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
			binaryPath = p
			return
		}
		binaryDir, binaryErr = os.MkdirTemp("", "baton-deploy-bin-")
		if binaryErr != nil {
			return
		}
		// The services run as an unprivileged user, who must reach it.
		if binaryErr = os.Chmod(binaryDir, 0o755); binaryErr != nil {
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

// batonBinary waits for the build and returns the binary's path.
func batonBinary() (string, error) {
	startBuild()
	<-binaryDone
	return binaryPath, binaryErr
}

// removeBinary removes the binary once no build runs any more.
func removeBinary() {
	binaryOnce.Do(func() { close(binaryDone) })
	<-binaryDone
	if binaryDir != "" {
		_ = os.RemoveAll(binaryDir)
	}
}

// outputLine is one line a process wrote.
type outputLine struct {
	stream string // stdout or stderr
	n      int    // its number on that stream, from 1
	text   string
}

// process is one running or finished process of a deployment, with every
// line it wrote.
type process struct {
	name string
	cmd  *exec.Cmd
	// service is set for a process that runs until it is stopped: its
	// exit before is a failure of the deployment.
	service bool
	// onLine sees each line as it is read.
	onLine func(p *process, l outputLine)
	// onExit is called once the process ended and all its output is read.
	onExit func(p *process)

	mu       sync.Mutex
	lines    []outputLine
	exitErr  error
	stopping bool
	done     chan struct{}
	// changed is closed, and replaced, at every new line and at the exit.
	changed chan struct{}
}

// start runs the process. cred, when not nil, is the user it runs as.
func (p *process) start(cred *syscall.Credential) error {
	p.done, p.changed = make(chan struct{}), make(chan struct{})
	// A process group of its own, so that a signal reaches only it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go p.read("stdout", stdout, &readers)
	go p.read("stderr", stderr, &readers)
	go func() {
		// Every byte is read before Wait closes the pipes.
		readers.Wait()
		err := p.cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		close(p.done)
		p.notifyLocked()
		p.mu.Unlock()
		if p.onExit != nil {
			p.onExit(p)
		}
	}()
	return nil
}

func (p *process) read(stream string, r io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		s, err := br.ReadString('\n')
		if s != "" {
			l := outputLine{stream: stream, n: n, text: strings.TrimSuffix(s, "\n")}
			p.mu.Lock()
			p.lines = append(p.lines, l)
			p.notifyLocked()
			p.mu.Unlock()
			if p.onLine != nil {
				p.onLine(p, l)
			}
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

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// output returns every line the process wrote so far.
func (p *process) output() []outputLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outputLine(nil), p.lines...)
}

// text returns what the process wrote on stream.
func (p *process) text(stream string) string {
	var b strings.Builder
	for _, l := range p.output() {
		if l.stream == stream {
			b.WriteString(l.text + "\n")
		}
	}
	return b.String()
}

// tail returns the last n lines, indented, with mask applied, for a
// failure message.
func (p *process) tail(n int, mask func(string) string) string {
	lines := p.output()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    " + mask(l.text) + "\n")
	}
	return b.String()
}

func (p *process) exitStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

func (p *process) isStopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// stop sends SIGTERM, as systemd does, and SIGKILL when the process has
// not ended after grace; it returns once the process ended.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
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
