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
		t.Fatalf("after %s, still waiting: %s", timeout, fmt.Sprintf(format, args...))
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
			t.Fatalf("after %s, still waiting: %s", timeout, fmt.Sprintf(format, args...))
			return
		}
	}
}
