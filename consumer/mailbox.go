package consumer

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	batonnats "github.com/batonhq/baton/nats"
)

// mailbox holds the triggers of one conversation on this worker. One
// goroutine per mailbox runs its turns one after another, so a worker never
// races itself for a conversation, while other conversations' mailboxes run
// beside it: a long turn delays nothing but its own conversation.
type mailbox struct {
	conversationID string
	// waiting are triggers not yet covered by a claim, and since when the
	// oldest waits; guarded by Worker.mu.
	waiting []jetstream.Msg
	since   time.Time
	// more is set when a capped or superseded turn left pending rows: the
	// mailbox runs another turn even with no trigger waiting.
	more bool
	// lastArrival is when the newest trigger arrived; arrived tells a
	// running turn that one did (a newer message may supersede it).
	lastArrival time.Time
	arrived     chan struct{}
	// unclaimable are the outbox rows of waiting triggers that the last
	// claim saw and did not take: rows a capped turn left, a commit not
	// visible yet, or a row that will never exist (its commit died with a
	// primary after the relay had published it). They are no newer
	// message, and never supersede the running turn: a row that becomes
	// visible meanwhile is caught at finalize, which looks at the
	// database (Finalize.SupersedeIfNewer).
	unclaimable map[int64]bool
}

// dispatch puts a trigger into its conversation's mailbox, starting the
// mailbox when it has none. It never blocks on a turn.
func (w *Worker) dispatch(msg jetstream.Msg) {
	conversationID, err := w.conversationOf(msg)
	if err != nil {
		// Not a trigger: redelivering it would never help.
		w.metrics.triggersBroken.Inc()
		w.log.Error().Err(err).Str("subject", msg.Subject()).Msg("terminate malformed event")
		_ = msg.Term()
		return
	}
	if w.session != nil && !w.session.Held() {
		// This worker can claim nothing until it holds its session
		// again, and another worker may be taking its conversations
		// over meanwhile: the trigger goes back to the group at once
		// instead of waiting here, perhaps behind a turn this worker can
		// no longer finish.
		_ = msg.NakWithDelay(w.cfg.RetryDelay)
		return
	}
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
		w.log.Debug().Str("conversation_id", conversationID).Uint64("delivered", md.NumDelivered).Msg("trigger redelivered")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	mb := w.mailboxes[conversationID]
	if mb == nil {
		mb = &mailbox{conversationID: conversationID, arrived: make(chan struct{}, 1)}
		w.mailboxes[conversationID] = mb
		w.wg.Add(1)
		go w.runMailbox(mb)
	}
	now := time.Now()
	if len(mb.waiting) == 0 {
		mb.since = now
	}
	mb.lastArrival = now
	mb.waiting = append(mb.waiting, msg)
	select {
	case mb.arrived <- struct{}{}:
	default:
	}
}

// conversationOf reads the conversation from the subject, which the relay
// derives from it, falling back to the trigger body.
func (w *Worker) conversationOf(msg jetstream.Msg) (string, error) {
	if _, id, err := batonnats.ParseSubject(w.cfg.Stream.SubjectPrefix, msg.Subject()); err == nil {
		return id, nil
	}
	t, err := batonnats.ParseTrigger(msg.Data())
	if err != nil {
		return "", err
	}
	return t.ConversationID, nil
}

// runMailbox runs turns for a conversation while triggers keep arriving,
// and ends when its mailbox is empty.
func (w *Worker) runMailbox(mb *mailbox) {
	defer w.wg.Done()
	for {
		if w.isStopping() || !w.acquireSlot(mb) {
			w.returnWaiting(mb)
			return
		}
		w.mu.Lock()
		batch := mb.waiting
		if len(batch) == 0 && !mb.more {
			// Handed back while this mailbox waited for a slot.
			delete(w.mailboxes, mb.conversationID)
			w.mu.Unlock()
			<-w.slots
			return
		}
		mb.waiting = nil
		mb.more = false
		// Arrivals before this claim are in it.
		select {
		case <-mb.arrived:
		default:
		}
		w.mu.Unlock()

		w.handle(mb, batch)
		<-w.slots

		w.mu.Lock()
		if len(mb.waiting) == 0 && !mb.more {
			delete(w.mailboxes, mb.conversationID)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

// acquireSlot waits for a free turn slot, keeping waiting triggers alive.
// It returns false when the worker stops first.
func (w *Worker) acquireSlot(mb *mailbox) bool {
	select {
	case w.slots <- struct{}{}:
		return true
	default:
	}
	tick := time.NewTicker(w.progressInterval())
	defer tick.Stop()
	for {
		select {
		case w.slots <- struct{}{}:
			return true
		case <-w.stopping:
			return false
		case <-tick.C:
			w.progress(mb, nil)
		}
	}
}

// progressInterval is how often held triggers are kept from redelivery.
func (w *Worker) progressInterval() time.Duration {
	return min(w.cfg.Lease, w.cfg.Consumer.AckWait) / 3
}

// progress tells JetStream that held triggers are being worked on, so it
// does not hand them to another worker while this one still has them.
func (w *Worker) progress(mb *mailbox, batch []jetstream.Msg) {
	for _, m := range batch {
		_ = m.InProgress()
	}
	w.mu.Lock()
	waiting := append([]jetstream.Msg(nil), mb.waiting...)
	w.mu.Unlock()
	for _, m := range waiting {
		_ = m.InProgress()
	}
}

// returnWaiting hands a stopping worker's unclaimed triggers back to the
// group at once, and closes the mailbox.
func (w *Worker) returnWaiting(mb *mailbox) {
	w.mu.Lock()
	waiting := mb.waiting
	mb.waiting = nil
	delete(w.mailboxes, mb.conversationID)
	w.mu.Unlock()
	for _, m := range waiting {
		_ = m.Nak()
	}
}

// handBackWaiting hands every trigger that waits in a mailbox back to the
// group, once the worker's session is lost: it can claim nothing until it
// holds the session again, and the other workers may be taking its
// conversations over. Without it, the triggers of a conversation whose
// turn runs here would wait behind that turn, which a cut-off worker can
// no longer finish, kept from redelivery by its progress signals, while
// the announcement of the takeover sits among them.
func (w *Worker) handBackWaiting() {
	w.mu.Lock()
	var back []jetstream.Msg
	for _, mb := range w.mailboxes {
		back = append(back, mb.waiting...)
		mb.waiting = nil
	}
	w.mu.Unlock()
	nakAll(back, w.cfg.RetryDelay)
}

// isStopping reports whether a graceful shutdown has started.
func (w *Worker) isStopping() bool {
	select {
	case <-w.stopping:
		return true
	default:
		return false
	}
}
