package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// PerfEnv names a folder: when it is set, Profile records where a process
// spends its processor time with perf, for a benchmark's reader to see
// what limits a figure (`perf report -i <file>`; a summary by symbol is
// written next to it).
const PerfEnv = "BATON_BENCH_PERF"

// Profile starts recording p's processor time with perf under label, when
// PerfEnv is set and perf is installed, and returns the function that
// stops the recording. Otherwise it does nothing.
func (p *Process) Profile(tb testing.TB, label string) (stop func()) {
	tb.Helper()
	dir := os.Getenv(PerfEnv)
	perf, err := exec.LookPath("perf")
	if dir == "" || err != nil {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	data := filepath.Join(dir, label+".data")
	cmd := exec.Command(perf, "record", "-F", "999", "-g", "-p", fmt.Sprint(p.Cmd.Process.Pid), "-o", data)
	if err := cmd.Start(); err != nil {
		tb.Logf("perf: %v", err)
		return func() {}
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
		out, _ := exec.Command(perf, "report", "-i", data, "--stdio", "--no-children", "--sort", "symbol", "--percent-limit", "0.5").Output()
		_ = os.WriteFile(filepath.Join(dir, label+".txt"), out, 0o644)
		tb.Logf("perf profile of %s: %s (summary in %s.txt)", p.Name, data, label)
	}
}
