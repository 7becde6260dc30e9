package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/proctest"
)

// Process is a running baton subcommand, run by proctest.
type Process struct {
	*proctest.Process
	Started time.Time
}

// Logs returns what the process wrote.
func (p *Process) Logs() string { return p.Text("") }

// Start runs binary with args as a process named name, with JSON logs, and
// stops it (SIGTERM, then SIGKILL after 20 seconds) when tb ends.
func Start(tb testing.TB, name, binary string, args ...string) *Process {
	tb.Helper()
	cmd := exec.Command(binary, append(args, "--log-format", "json")...)
	// Its own process group: a Ctrl-C reaches the benchmark, which stops
	// the processes in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	started := time.Now()
	proc, err := proctest.Start(name, cmd, proctest.Options{})
	if err != nil {
		tb.Fatalf("bench: %v", err)
	}
	p := &Process{Process: proc, Started: started}
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s output (last lines):\n%s", name, p.Tail(30))
		}
	})
	return p
}

// Stop asks the process to stop and waits for it; a process that does not
// stop within 20 seconds is killed.
func (p *Process) Stop() { p.Process.Stop(20 * time.Second) }

// WaitLogged waits until the process logged s.
func (p *Process) WaitLogged(tb testing.TB, s string, within time.Duration) {
	tb.Helper()
	if _, err := p.AwaitLine(nil, within, s); err != nil {
		tb.Fatalf("bench: %v", err)
	}
}

// Memory is a process's resident memory, now and at its peak.
type Memory struct {
	RSS, PeakRSS int64 // bytes
}

// Memory reads the process's resident set size and its peak (VmRSS and
// VmHWM) from /proc.
func (p *Process) Memory() (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
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

// CPU is the processor time the process used so far (user and system),
// from /proc.
func (p *Process) CPU() (time.Duration, error) { return CPU(p.Cmd.Process.Pid) }

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
