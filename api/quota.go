package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/batonhq/baton/schema"
)

// Defaults of the per-user quotas.
const (
	// DefaultMaxConversations is how many conversations one user may
	// have.
	DefaultMaxConversations = 1000
	// DefaultMaxRetriesPerHour is how many times an hour a user may ask
	// for a conversation's failed turn to be tried again: each retry is a
	// new round of model calls.
	DefaultMaxRetriesPerHour = 10
)

// Quotas bound what one user can make the system do, whatever other users
// do. A negative value turns a quota off.
type Quotas struct {
	// MaxConversations per user; creating one more gets 429. Defaults to
	// 1000.
	MaxConversations int
	// MaxRetriesPerHour per conversation (POST .../retry); past it, 429
	// with Retry-After. Defaults to 10.
	MaxRetriesPerHour int
}

// WithDefaults returns a copy with every zero field set to its default.
func (q Quotas) WithDefaults() Quotas {
	if q.MaxConversations == 0 {
		q.MaxConversations = DefaultMaxConversations
	}
	if q.MaxRetriesPerHour == 0 {
		q.MaxRetriesPerHour = DefaultMaxRetriesPerHour
	}
	return q
}

// quotaExceeded writes 429 for a *schema.QuotaError, with Retry-After when
// time frees the quota, and reports whether err was one.
func quotaExceeded(w http.ResponseWriter, err error) bool {
	var q *schema.QuotaError
	if !errors.As(err, &q) {
		return false
	}
	msg := q.Error()
	if q.RetryAfter > 0 {
		secs := int((q.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		msg += "; try again in " + strconv.Itoa(secs) + " s"
	} else {
		msg += "; delete some first"
	}
	writeError(w, http.StatusTooManyRequests, "quota_exceeded", msg)
	return true
}
