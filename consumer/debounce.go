package consumer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/batonhq/baton/schema"
)

// watchArrivals acts, by the conversation's double texting, when a
// trigger of a newer message of its conversation arrives on this worker
// while the turn runs:
//
//   - debounce: the newer message supersedes the turn before it started a
//     write: the model call is cancelled and the next turn answers all
//     the messages together. Newer messages that arrive at another
//     worker are caught at finalize (Finalize.SupersedeIfNewer).
//   - interrupt: the message asked the turn to stop when it was stored;
//     the turn asks the database at once (its lease renewal says so), so
//     that it stops without waiting for the API's stop notice, which a
//     message of the SQL producer does not send.
//   - enqueue, reject: nothing; the newer message waits for its own turn,
//     or was never stored.
//
// The returned function stops the watch and waits for it.
func (t *turn) watchArrivals() func() {
	w, c := t.w, t.claim
	var arrived func() bool
	switch {
	case c.DoubleTexting == schema.DoubleTextingInterrupt:
		arrived = t.interruptedByArrival
	case c.DoubleTexting == schema.DoubleTextingDebounce && w.cfg.Debounce > 0 && !c.More:
		arrived = t.supersededByArrival
	default:
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-t.ctx.Done():
				return
			case <-t.mb.arrived:
			}
			if w.newerTrigger(t.mb, c.OutboxIDs) && arrived() {
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-done
	}
}

// supersededByArrival supersedes the turn for a newer message, unless it
// started a write; it reports whether it did.
func (t *turn) supersededByArrival() bool {
	if !t.journal.supersede() {
		return false
	}
	t.cancel(errSuperseded)
	return true
}

// interruptedByArrival renews the lease now, which says whether the run
// was asked to stop, and stops the turn when it was (journal.stop: a
// write that runs returns first); it reports whether it was.
func (t *turn) interruptedByArrival() bool {
	renewed, err := schema.RenewLease(t.ctx, t.w.pool, t.claim.ConversationID, t.claim.RunID, t.w.cfg.Lease)
	switch {
	case errors.Is(err, schema.ErrStopRequested):
		t.lease.set(renewed)
		t.log.Debug().Msg("a newer message interrupted the turn")
		t.journal.stop()
		return true
	case err == nil:
		t.lease.set(renewed)
	}
	// Any other error is the lease renewal's to handle, at its next turn.
	return false
}

// newerTrigger reports whether the mailbox holds a trigger of a row the
// claim did not take.
func (w *Worker) newerTrigger(mb *mailbox, claimed []int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range mb.waiting {
		if id, ok := outboxIDOf(m); ok && !slices.Contains(claimed, id) && !mb.unclaimable[id] {
			return true
		}
	}
	return false
}

// quietWindow holds a reply until Debounce has passed since the newest
// message of its conversation arrived, so that a message sent right after
// it supersedes the turn instead of getting a turn of its own: a burst
// gets one reply. Only a conversation whose double texting is debounce
// waits for it. A real model call takes longer than the window, so a
// lone message waits for nothing; its model call starts at once either way.
func (w *Worker) quietWindow(ctx context.Context, mb *mailbox) {
	if w.cfg.Debounce <= 0 {
		return
	}
	w.mu.Lock()
	wait := time.Until(mb.lastArrival.Add(w.cfg.Debounce))
	w.mu.Unlock()
	if wait <= 0 {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
