package console

import (
	"math"
	"strconv"
	"time"
)

// retryAfter is a Retry-After value: whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(int(math.Ceil(d.Seconds())))
}
