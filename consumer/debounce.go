package consumer

import (
	"context"
	"slices"
	"time"
)

// watchArrivals supersedes the running turn when a trigger of a newer
// message of its conversation arrives on this worker before the turn
// started a write: the model call is cancelled and the next turn answers
// all the messages together. Newer messages that arrive at another worker
// are caught at finalize (Finalize.SupersedeIfNewer). The returned
// function stops the watch and waits for it.
func (t *turn) watchArrivals() func() {
	w := t.w
	if w.cfg.Debounce <= 0 || t.claim.More {
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
			if w.newerTrigger(t.mb, t.claim.OutboxIDs) && t.journal.supersede() {
				t.cancel(errSuperseded)
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-done
	}
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
// gets one reply. A real model call takes longer than the window, so a
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
