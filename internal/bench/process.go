package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a running baton subcommand.
type Process struct {
	Name    string
	Started time.Time

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	logs bytes.Buffer
}

func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

// Logs returns what the process wrote.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Start runs binary with args as a process named name, with JSON logs, and
// stops it (SIGTERM, then SIGKILL after 20 seconds) when tb ends.
func Start(tb testing.TB, name, binary string, args ...string) *Process {
	tb.Helper()
	p := &Process{Name: name, done: make(chan struct{})}
	p.cmd = exec.Command(binary, append(args, "--log-format", "json")...)
	p.cmd.Stdout = p
	p.cmd.Stderr = p
	// Its own process group: a Ctrl-C reaches the benchmark, which stops
	// the processes in order.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.Started = time.Now()
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("bench: start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s output (last lines):\n%s", name, tail(p.Logs(), 30))
		}
	})
	return p
}

// Stop asks the process to stop and waits for it; a process that does not
// stop within 20 seconds is killed.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Exited is closed when the process ends.
func (p *Process) Exited() <-chan struct{} { return p.done }

// WaitLogged waits until the process logged s.
func (p *Process) WaitLogged(tb testing.TB, s string, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(p.Logs(), s) {
		select {
		case <-p.done:
			tb.Fatalf("bench: %s exited before logging %q:\n%s", p.Name, s, tail(p.Logs(), 30))
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("bench: %s did not log %q within %s:\n%s", p.Name, s, within, tail(p.Logs(), 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Memory is a process's resident memory, now and at its peak.
type Memory struct {
	RSS, PeakRSS int64 // bytes
}

// Memory reads the process's resident set size and its peak (VmRSS and
// VmHWM) from /proc.
func (p *Process) Memory() (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	var m Memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.PeakRSS = kb << 10
		}
	}
	return m, sc.Err()
}

// Run runs binary with args to completion and returns its output.
func Run(binary string, args ...string) (string, error) {
	out, err := exec.Command(binary, args...).CombinedOutput()
	return string(out), err
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// CPU is the processor time the process used so far (user and system),
// from /proc.
func (p *Process) CPU() (time.Duration, error) { return CPU(p.cmd.Process.Pid) }

// CPU is the processor time process pid used so far (user and system),
// from /proc; 0 is this process.
func CPU(pid int) (time.Duration, error) {
	if pid == 0 {
		pid = os.Getpid()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count from after it.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("bench: short /proc stat: %q", s)
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	// Linux reports clock ticks of 1/100 s (USER_HZ).
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
