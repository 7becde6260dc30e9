package consumer

import "time"

// debounce waits until the oldest waiting trigger of the mailbox is
// Debounce old, so that messages sent in quick succession are claimed as
// one turn. Triggers that waited through a turn of their conversation are
// past the window already and claim at once. It returns false when the
// worker stops first.
func (w *Worker) debounce(mb *mailbox) bool {
	if w.cfg.Debounce <= 0 {
		select {
		case <-w.stopping:
			return false
		default:
			return true
		}
	}
	w.mu.Lock()
	wait := time.Until(mb.since.Add(w.cfg.Debounce))
	w.mu.Unlock()
	if wait <= 0 {
		select {
		case <-w.stopping:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stopping:
		return false
	}
}
