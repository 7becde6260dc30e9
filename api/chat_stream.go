package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Timings of a chat stream.
const (
	// snapshotTimeout bounds the wait for the worker that runs a turn to
	// answer a snapshot request; without an answer (the worker died, or
	// runs an older version) the stream shows the reply once it is
	// committed.
	snapshotTimeout = time.Second
	// snapshotEvery is how often a stream that could not follow a run
	// asks for a snapshot again.
	snapshotEvery = 2 * time.Second
	// heldDeltas bounds the live deltas a stream holds for runs it does
	// not know yet (their processing event may come after them).
	heldDeltas = 256
	// lookupEvery is how long a stream waiting for its turn holds the
	// deltas of a run it cannot place before it asks the database which
	// run they come from, and how often it asks at most: the run's
	// processing event, which says it, may come late or be lost.
	lookupEvery = 250 * time.Millisecond
)

// chatFollower streams the reply that answers one outbox row: it reads the
// conversation events and live deltas that the hub hands it, and the
// database where an event may have been lost. It claims nothing and writes
// nothing: the turn runs wherever a worker runs it.
type chatFollower struct {
	s   *Server
	key string // the conversation's key
	row int64  // the outbox row whose reply is streamed
	l   *listener
	out *uiStream

	// run is the run being followed and reply its live state, to seq.
	run    string
	reply  batonnats.LiveReply
	synced bool
	// lastSnapshot is when a snapshot of run was last asked for.
	lastSnapshot time.Time
	// held are deltas of runs not known yet, by run, held since heldAt.
	held   map[string][]batonnats.LiveDelta
	heldAt map[string]time.Time
	nheld  int
	// lastLookup is when the database was last asked about a delta's run;
	// others are runs it said are not this stream's (an earlier turn of
	// the conversation, say).
	lastLookup time.Time
	others     map[string]bool
}

// follow streams until the reply's end, the client's leaving or the
// server's closing. The listener must be registered before the row could
// change, or before the row's state is first read (check), so that
// nothing between is missed.
func (f *chatFollower) follow(ctx context.Context, check bool) {
	f.held, f.heldAt, f.others = map[string][]batonnats.LiveDelta{}, map[string]time.Time{}, map[string]bool{}
	if check {
		f.check(ctx)
	}
	f.out.flush()
	tick := time.NewTicker(sseHeartbeat)
	defer tick.Stop()
	recheck := time.NewTicker(f.s.cfg.StreamRecheck)
	defer recheck.Stop()
	for !f.out.done && f.out.err == nil {
		select {
		case <-ctx.Done():
			return
		case <-f.s.closing:
			// Cut the connection rather than end the response: a client
			// that reads a clean end takes the reply as finished, one
			// whose connection breaks resumes it, from another process.
			panic(http.ErrAbortHandler)
		case e := <-f.l.events:
			f.event(ctx, e)
		case d := <-f.l.deltas:
			f.delta(ctx, d)
		case <-tick.C:
			f.out.comment()
		case <-recheck.C:
			// An event may have been lost (it is published after its
			// commit); the database says for sure.
			f.check(ctx)
		}
		if f.l.lagging.Swap(false) {
			f.check(ctx)
		}
		f.drain(ctx)
		f.out.flush()
	}
}

// drain handles what else is already waiting, so that one flush sends it.
func (f *chatFollower) drain(ctx context.Context) {
	for range listenerEvents + listenerDeltas {
		if f.out.done {
			return
		}
		select {
		case e := <-f.l.events:
			f.event(ctx, e)
		case d := <-f.l.deltas:
			f.delta(ctx, d)
		default:
			return
		}
	}
}

// event handles a committed change of the conversation.
func (f *chatFollower) event(ctx context.Context, e hubEvent) {
	var ev batonnats.ConversationEvent
	if json.Unmarshal(e.data, &ev) != nil {
		return
	}
	ours := slices.Contains(ev.OutboxIDs, f.row)
	switch ev.Type {
	case batonnats.EventProcessing:
		if ours {
			// The run started after the stream began, most likely: its
			// first delta says whether the stream saw it from the start.
			f.begin(ctx, ev.RunID, ev.MessageID, false)
		}
	case batonnats.EventPending, batonnats.EventWaiting:
		if ours && ev.RunID == f.run {
			// Retried or handed back: the next run starts over.
			f.run, f.synced = "", false
		}
	case batonnats.EventWaitingForApproval:
		if ours {
			// The turn stopped at a call for its user: the database
			// says which.
			f.check(ctx)
		}
	case batonnats.EventReplied, batonnats.EventFailed:
		if ours {
			f.finish(ctx, ev.MessageID)
		}
	case batonnats.EventStopped:
		switch {
		case ours && ev.MessageID != "":
			f.finish(ctx, ev.MessageID)
		case ours:
			f.out.settle()
		}
	case batonnats.EventCancelled, batonnats.EventDeleted:
		f.out.fail(chatDeletedText)
	}
}

// begin follows run, whose reply will be replyID. eager asks the worker
// for the reply so far at once; otherwise the run's first delta tells
// whether the stream saw it from the start.
func (f *chatFollower) begin(ctx context.Context, run, replyID string, eager bool) {
	if run == "" || run == f.run {
		return
	}
	f.out.start(replyID)
	f.run, f.synced, f.lastSnapshot = run, false, time.Time{}
	f.reply = batonnats.LiveReply{RunID: run}
	held := f.held[run]
	delete(f.held, run)
	f.nheld -= len(held)
	clear(f.heldAt)
	if eager && (len(held) == 0 || held[0].Seq != 1) {
		f.snapshot(ctx)
	}
	for _, d := range held {
		f.apply(ctx, d)
	}
	// Deltas of other runs are previews no one shows any more.
	clear(f.held)
	f.nheld = 0
}

// delta handles a live delta of the conversation.
func (f *chatFollower) delta(ctx context.Context, d *liveDelta) {
	if !d.fromRun {
		f.s.metrics.dropped.WithLabelValues(dropNotCurrentRun).Inc()
		return
	}
	if d.runID != f.run {
		if f.others[d.runID] {
			return
		}
		// Its processing event may still come: hold it, a few at most.
		if f.nheld < heldDeltas {
			if len(f.held[d.runID]) == 0 {
				f.heldAt[d.runID] = time.Now()
			}
			f.held[d.runID] = append(f.held[d.runID], d.delta)
			f.nheld++
		}
		if f.run == "" && time.Since(f.heldAt[d.runID]) >= lookupEvery && time.Since(f.lastLookup) >= lookupEvery {
			// The deltas came before the event: the database knows
			// whether the run is this stream's.
			f.lastLookup = time.Now()
			f.check(ctx)
			if f.run != d.runID && len(f.others) < heldDeltas {
				f.others[d.runID] = true
			}
		}
		return
	}
	f.apply(ctx, d.delta)
}

// apply folds the next delta of the followed run in and sends what it
// adds. A gap (deltas lost, or a stream that joined the run late) is
// filled by a snapshot from the worker; deltas the snapshot covers are
// dropped, so no text comes twice.
func (f *chatFollower) apply(ctx context.Context, d batonnats.LiveDelta) {
	if d.Seq <= f.reply.Seq {
		return
	}
	if d.Seq != f.reply.Seq+1 || !f.synced && d.Seq != 1 {
		f.snapshot(ctx)
		if d.Seq != f.reply.Seq+1 {
			return
		}
	}
	f.reply.Apply(d)
	f.synced = true
	f.out.sync(f.reply.Parts)
}

// snapshot asks the worker that runs the followed run for the reply so
// far, at most once every snapshotEvery, and shows it.
func (f *chatFollower) snapshot(ctx context.Context) {
	nc := f.s.cfg.NATS
	if nc == nil || f.run == "" || time.Since(f.lastSnapshot) < snapshotEvery {
		return
	}
	f.lastSnapshot = time.Now()
	rctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, batonnats.SnapshotSubject(f.key, f.run), nil)
	if err != nil {
		return
	}
	var snap batonnats.LiveReply
	if json.Unmarshal(msg.Data, &snap) != nil || snap.RunID != f.run || snap.Seq < f.reply.Seq {
		return
	}
	f.reply, f.synced = snap, true
	f.out.sync(f.reply.Parts)
}

// check reads the row's state, for what the events may not have said.
func (f *chatFollower) check(ctx context.Context) {
	t, err := schema.ReadRowTurn(ctx, f.s.pool, f.key, f.row)
	switch {
	case errors.Is(err, schema.ErrNotFound):
		f.out.fail(chatVanishedText)
	case err != nil:
		if ctx.Err() == nil {
			f.s.log.Warn().Err(err).Msg("read the turn a chat stream follows")
		}
	case t.Status == "processing":
		f.begin(ctx, t.RunID, t.RunReplyID, true)
	case t.Status == "pending":
		f.run, f.synced = "", false
		a, err := schema.WaitingApproval(ctx, f.s.pool, f.key, f.row)
		if err != nil {
			if ctx.Err() == nil {
				f.s.log.Warn().Err(err).Msg("read the approval a chat stream's turn waits for")
			}
			return
		}
		if a != nil {
			f.out.awaitApproval(a)
		}
	case t.Settled:
		f.out.settle()
	case t.ReplyID != "":
		f.finish(ctx, t.ReplyID)
	default:
		// Settled long ago, its run pruned: nothing to show.
		f.out.settle()
	}
}

// finish ends the stream with the committed reply or visible error.
func (f *chatFollower) finish(ctx context.Context, messageID string) {
	m, err := schema.ChatReply(ctx, f.s.pool, f.key, messageID)
	switch {
	case errors.Is(err, schema.ErrNotFound):
		f.out.fail(chatVanishedText)
	case err != nil:
		if ctx.Err() == nil {
			f.s.log.Warn().Err(err).Msg("read the reply of a chat stream")
		}
		f.out.err = err
	case m.Role == schema.RoleError:
		f.out.fail(m.Content)
	default:
		f.out.finish(m)
	}
}
