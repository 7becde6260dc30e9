package relay

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// txn is one decoded transaction (or one standalone logical message) on its
// way to JetStream: its events are in flight until acknowledged, and its end
// LSN is known once its commit has been decoded.
type txn struct {
	commitTime time.Time
	end        pglogrepl.LSN
	committed  bool
	pending    int
}

// tracker decides which LSN may be confirmed to the slot: the end LSN of the
// newest transaction that, with every transaction before it, has all its
// events acknowledged by JetStream. Confirming more would let PostgreSQL
// discard WAL of an event that a crash could still lose; the slot resends
// everything after the confirmed position, and the events' Nats-Msg-Id makes
// JetStream drop the copies it already stored.
//
// The decoding goroutine calls begin, add and commit; the goroutine that
// waits for acknowledgements calls acked.
type tracker struct {
	mu        sync.Mutex
	queue     []*txn
	confirmed pglogrepl.LSN
	inFlight  int
}

// newTracker starts at the slot's confirmed position, so that the relay never
// reports less than the slot already has: PostgreSQL 15 would move the slot
// backwards.
func newTracker(confirmed pglogrepl.LSN) *tracker {
	return &tracker{confirmed: confirmed}
}

// begin opens a transaction whose events follow.
func (t *tracker) begin(commitTime time.Time) *txn {
	t.mu.Lock()
	defer t.mu.Unlock()
	x := &txn{commitTime: commitTime}
	t.queue = append(t.queue, x)
	return x
}

// add counts one more event of x in flight.
func (t *tracker) add(x *txn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x.pending++
	t.inFlight++
}

// commit records x's end LSN: x can be confirmed once its events are acked.
func (t *tracker) commit(x *txn, end pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x.end = end
	x.committed = true
	t.advance()
}

// acked counts one event of x as stored by JetStream.
func (t *tracker) acked(x *txn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x.pending--
	t.inFlight--
	t.advance()
}

func (t *tracker) advance() {
	n := 0
	for _, x := range t.queue {
		if !x.committed || x.pending > 0 {
			break
		}
		if x.end > t.confirmed {
			t.confirmed = x.end
		}
		n++
	}
	if n > 0 {
		clear(t.queue[:n])
		t.queue = t.queue[n:]
	}
}

// Confirmed returns the LSN that is safe to confirm to the slot.
func (t *tracker) Confirmed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed
}

// InFlight returns the number of events published and not yet acked.
func (t *tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}
