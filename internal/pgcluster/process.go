package pgcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processState returns the state letter of pid from /proc/<pid>/stat
// ("R" running, "S" sleeping, "T" stopped, "Z" zombie, ...), and ok=false
// when the process does not exist or /proc cannot tell.
func processState(pid int) (state string, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", false
	}
	st, _, ok := parseStat(string(b))
	return st, ok
}

// parseStat returns the state and parent pid of a /proc/<pid>/stat line:
// "pid (comm) state ppid ...". The command may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStat(line string) (state string, ppid int, ok bool) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return "", 0, false
	}
	fields := strings.Fields(line[i+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return "", 0, false
	}
	return fields[0], ppid, true
}

// descendants lists the processes below pid: its children, theirs, and so
// on. Without /proc it returns nil.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if _, ppid, ok := parseStat(string(b)); ok {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}

// killServer sends SIGKILL to the postmaster pid and to every process
// below it, and returns the pids of those below. The server's process
// group is not enough: each child of the postmaster makes itself a session
// and process group of its own. The postmaster is stopped first, so that
// it forks nothing between the listing and the kill.
func killServer(pid int) []int {
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	below := descendants(pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, p := range below {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	return below
}

// waitGone waits until none of pids runs. Zombies count as gone: they hold
// no memory, port or file.
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	backoff := time.Millisecond
	for {
		var left []int
		for _, p := range pids {
			if st, ok := processState(p); ok && st != "Z" && st != "X" {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of the killed postgres still run %s after SIGKILL", left, timeout)
		}
		time.Sleep(backoff)
		if backoff < 50*time.Millisecond {
			backoff *= 2
		}
	}
}
