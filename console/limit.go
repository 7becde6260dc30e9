package console

import (
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// signInLimiter is a token bucket per client address for sign-in
// attempts: guessing tokens is slow, and one address that tries many
// slows nobody else down.
type signInLimiter struct {
	limit rate.Limit
	burst int
	// idle is how long an empty bucket takes to fill up: one unused for
	// that long is full, the same as a new one, so it is dropped.
	idle time.Duration

	mu        sync.Mutex
	buckets   map[string]*signInBucket
	lastSweep time.Time
}

type signInBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newSignInLimiter(perMinute, burst int) *signInLimiter {
	limit := rate.Limit(float64(perMinute) / 60)
	return &signInLimiter{
		limit:   limit,
		burst:   burst,
		idle:    time.Duration(float64(burst) / float64(limit) * float64(time.Second)),
		buckets: map[string]*signInBucket{},
	}
}

// take takes one attempt from the address's bucket, or says how long
// until one is there.
func (l *signInLimiter) take(addr string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) >= l.idle {
		l.lastSweep = now
		for a, b := range l.buckets {
			if now.Sub(b.seen) >= l.idle {
				delete(l.buckets, a)
			}
		}
	}
	b := l.buckets[addr]
	if b == nil {
		b = &signInBucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[addr] = b
	}
	b.seen = now
	res := b.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d
	}
	return 0
}

// retryAfter is a Retry-After value: whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(int(math.Ceil(d.Seconds())))
}
