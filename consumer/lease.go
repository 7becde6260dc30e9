package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton/schema"
)

// renewLease renews the lease and keeps the triggers from redelivery while
// the turn runs. When the lease cannot be renewed before it expires, or
// the conversation is gone, it ends the turn's context with the reason;
// when the run was asked to stop (a notice this worker missed), it calls
// stop and goes on renewing until the turn ended. The returned function
// stops it and waits for it.
func (t *turn) renewLease() func() {
	w, ctx, claim := t.w, t.ctx, t.claim
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		until := claim.LeaseExpiresAt
		tick := time.NewTicker(w.progressInterval())
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.progress(t.mb, t.batch)
			renewed, err := schema.RenewLease(ctx, w.pool, claim.ConversationID, claim.RunID, w.cfg.Lease)
			switch {
			case err == nil:
				until = renewed
				t.lease.set(renewed)
			case errors.Is(err, schema.ErrStopRequested):
				until = renewed
				t.lease.set(renewed)
				t.journal.stop()
			case errors.Is(err, schema.ErrConversationDeleted), errors.Is(err, schema.ErrLeaseLost):
				t.cancel(err)
				return
			case ctx.Err() != nil:
				return
			default:
				t.log.Warn().Err(err).Time("lease_expires_at", until).Msg("renew lease")
				// Keep trying while the lease holds; past it another
				// worker may own the conversation, so the turn must stop.
				if time.Now().Add(w.progressInterval()).After(until) {
					t.cancel(schema.ErrLeaseLost)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(stop) })
		wg.Wait()
	}
}

// leaseKey is the context key of a turn's lease deadline.
type leaseKey struct{}

// leaseDeadline is a turn's lease expiry as its renewals move it.
type leaseDeadline struct{ unixNano atomic.Int64 }

func (l *leaseDeadline) set(t time.Time) { l.unixNano.Store(t.UnixNano()) }

// withLease gives ctx the turn's lease deadline.
func withLease(ctx context.Context, l *leaseDeadline) context.Context {
	return context.WithValue(ctx, leaseKey{}, l)
}

// LeaseDeadline is when the lease of the turn whose step ctx runs expires
// unless it is renewed: a credential an agent is given for a step (a
// token) should end no later. false outside a worker's turn.
func LeaseDeadline(ctx context.Context) (time.Time, bool) {
	l, ok := ctx.Value(leaseKey{}).(*leaseDeadline)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, l.unixNano.Load()), true
}
