package agent

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// backoff is the wait before retry number n (0 for the first): the base
// doubled n times, capped, less a random jitter of up to half of it, so
// workers that failed together do not retry together.
func backoff(n int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	if d <= 1 {
		return d
	}
	return d - rand.N(d/2)
}

// parseRetryAfter reads how long the server asked to wait: retry-after-ms
// (sent by some OpenAI-compatible servers) or Retry-After in seconds or as
// an HTTP date. ok is false when the response asks nothing.
func parseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if h == nil {
		return 0, false
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
