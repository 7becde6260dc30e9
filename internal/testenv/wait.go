package testenv

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// WaitOrTimeout returns the next value from ch, or fails t when timeout
// passes first: a test waits on the signal a hook sends instead of polling.
func WaitOrTimeout[T any](t testing.TB, ch <-chan T, timeout time.Duration, format string, args ...any) T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		stillWaiting(t, timeout, format, args...)
		var zero T
		return zero
	}
}

// Signal tells waiters that something changed. A hook calls Notify after
// each change it records; WaitFor checks its condition again at each one.
// The zero value is ready to use.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// Notify wakes every waiter.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// next returns a channel closed by the next Notify.
func (s *Signal) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// WaitFor returns once cond holds, checking it at once and again after
// every Notify of s, and fails t when timeout passes first.
func WaitFor(t testing.TB, s *Signal, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		// Taken before cond is checked, so a change between the check and
		// the wait is not missed.
		changed := s.next()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			stillWaiting(t, timeout, format, args...)
			return
		}
	}
}

// pollInterval is how long Eventually waits after a check before the
// next one.
const pollInterval = 10 * time.Millisecond

// Eventually returns once cond holds, checking it at once and again 10ms
// after each check, and fails t when timeout passes first. It is for
// state that offers no signal to wait on (rows, a server's views, a
// stream's state); where a hook can signal the change, WaitFor it instead.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for !cond() {
		// The pause starts after the check, so a slow check (a query on a
		// loaded server) is not run again at once.
		select {
		case <-time.After(pollInterval):
		case <-timer.C:
			stillWaiting(t, timeout, format, args...)
			return
		}
	}
}

func stillWaiting(t testing.TB, timeout time.Duration, format string, args ...any) {
	t.Helper()
	t.Fatalf("after %s, still waiting: %s", timeout, fmt.Sprintf(format, args...))
}
