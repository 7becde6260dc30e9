// Package keyedlimit is a token bucket per key (a user, a client address):
// one key that floods is refused without slowing any other down.
package keyedlimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter holds a bucket per key. A bucket unused for as long as it takes
// to fill up from empty is full, the same as a new one, so it is dropped:
// memory holds the keys active in the last two such spans.
type Limiter[K comparable] struct {
	limit rate.Limit
	burst int
	idle  time.Duration

	mu        sync.Mutex
	buckets   map[K]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// New returns a limiter of perMinute takes a minute per key, burst at
// once.
func New[K comparable](perMinute, burst int) *Limiter[K] {
	limit := rate.Limit(float64(perMinute) / 60)
	return &Limiter[K]{
		limit:   limit,
		burst:   burst,
		idle:    time.Duration(float64(burst) / float64(limit) * float64(time.Second)),
		buckets: make(map[K]*bucket),
	}
}

// Take takes one from key's bucket at now, or says how long until one is
// there (and takes nothing).
func (l *Limiter[K]) Take(key K, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) >= l.idle {
		l.lastSweep = now
		for k, b := range l.buckets {
			if now.Sub(b.seen) >= l.idle {
				delete(l.buckets, k)
			}
		}
	}
	b := l.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[key] = b
	}
	b.seen = now
	res := b.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d
	}
	return 0
}
