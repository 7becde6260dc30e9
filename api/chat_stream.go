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

// chatStream is the AI SDK's UI message stream over a follower: the reply
// that answers one outbox row, from the conversation events and live
// deltas the follower hands it, and the database where an event may have
// been lost. It claims nothing and writes nothing: the turn runs wherever
// a worker runs it.
type chatStream struct {
	*sseWriter // the writer out writes to
	s          *Server
	key        string // the conversation's key
	row        int64  // the outbox row whose reply is streamed
	out        *uiStream
	// checkFirst reads the row's state before anything else: it may have
	// changed before the follower subscribed.
	checkFirst bool

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

func newChatStream(s *Server, key string, row int64, out *uiStream, checkFirst bool) *chatStream {
	return &chatStream{
		sseWriter: out.sse, s: s, key: key, row: row, out: out, checkFirst: checkFirst,
		held: map[string][]batonnats.LiveDelta{}, heldAt: map[string]time.Time{}, others: map[string]bool{},
	}
}

// catchUp opens the stream and, with checkFirst, shows where the row's
// turn stands: for a message stored before the follower subscribed, or a
// resumed stream, only the database knows.
func (c *chatStream) catchUp(ctx context.Context, _ *follower) {
	c.out.begin()
	if c.checkFirst {
		c.check(ctx)
	}
}

// event follows what a committed change says of the row's turn.
func (c *chatStream) event(ctx context.Context, _ uint64, ev batonnats.ConversationEvent) {
	ours := slices.Contains(ev.OutboxIDs, c.row)
	switch ev.Type {
	case batonnats.EventProcessing:
		if ours {
			// The run started after the stream began, most likely: its
			// first delta says whether the stream saw it from the start.
			c.begin(ctx, ev.RunID, ev.MessageID, false)
		}
	case batonnats.EventPending, batonnats.EventWaiting:
		if ours && ev.RunID == c.run {
			// Retried or handed back: the next run starts over.
			c.run, c.synced = "", false
		}
	case batonnats.EventWaitingForApproval:
		if ours || c.run == "" && !c.out.started {
			// The turn stopped at a call for its user (this row's, or
			// the one this row waits behind): the database says which.
			c.check(ctx)
		}
	case batonnats.EventReplied, batonnats.EventFailed:
		if ours {
			c.finish(ctx, ev.MessageID)
		}
	case batonnats.EventStopped:
		switch {
		case ours && ev.MessageID != "":
			c.finish(ctx, ev.MessageID)
		case ours:
			c.out.settle()
		}
	case batonnats.EventCancelled, batonnats.EventDeleted:
		c.out.fail(chatDeletedText)
	}
}

// delta shows a live delta of the followed run, and holds one of a run
// the stream does not know yet.
func (c *chatStream) delta(ctx context.Context, d *liveDelta) {
	if !d.fromRun {
		c.s.metrics.dropped.WithLabelValues(dropNotCurrentRun).Inc()
		return
	}
	if d.runID != c.run {
		c.hold(ctx, d)
		return
	}
	c.apply(ctx, d.delta)
}

// recheck reads the row's state: an event may have been lost (it is
// published after its commit), and the database says for sure.
func (c *chatStream) recheck(ctx context.Context) { c.check(ctx) }

// lagged reads the row's state, for what the events the hub dropped said.
func (c *chatStream) lagged(ctx context.Context) { c.check(ctx) }

// closing cuts the connection rather than end the response: a client that
// reads a clean end takes the reply as finished, one whose connection
// breaks resumes it, from another process.
func (c *chatStream) closing() { panic(http.ErrAbortHandler) }

// gone does not end the stream: with no events from the hub any more, its
// rechecks bring it to the reply's end.
func (c *chatStream) gone() {}

// expired is never called: a chat stream ends with its reply, not with its
// token (the follower has no expiry for it).
func (c *chatStream) expired() {}

// begin follows run, whose reply will be replyID. eager asks the worker
// for the reply so far at once; otherwise the run's first delta tells
// whether the stream saw it from the start.
func (c *chatStream) begin(ctx context.Context, run, replyID string, eager bool) {
	if run == "" || run == c.run {
		return
	}
	c.out.start(replyID)
	c.run, c.synced, c.lastSnapshot = run, false, time.Time{}
	c.reply = batonnats.LiveReply{RunID: run}
	held := c.held[run]
	delete(c.held, run)
	c.nheld -= len(held)
	clear(c.heldAt)
	if eager && (len(held) == 0 || held[0].Seq != 1) {
		c.snapshot(ctx)
	}
	for _, d := range held {
		c.apply(ctx, d)
	}
	// Deltas of other runs are previews no one shows any more.
	clear(c.held)
	c.nheld = 0
}

// hold keeps a delta of another run than the followed one, a few at most:
// its processing event may still come. Held long enough with no run
// followed, the database says whether the run is this stream's.
func (c *chatStream) hold(ctx context.Context, d *liveDelta) {
	if c.others[d.runID] {
		return
	}
	if c.nheld < heldDeltas {
		if len(c.held[d.runID]) == 0 {
			c.heldAt[d.runID] = time.Now()
		}
		c.held[d.runID] = append(c.held[d.runID], d.delta)
		c.nheld++
	}
	if c.run == "" && time.Since(c.heldAt[d.runID]) >= lookupEvery && time.Since(c.lastLookup) >= lookupEvery {
		c.lastLookup = time.Now()
		c.check(ctx)
		if c.run != d.runID && len(c.others) < heldDeltas {
			c.others[d.runID] = true
		}
	}
}

// apply folds the next delta of the followed run in and sends what it
// adds. A gap (deltas lost, or a stream that joined the run late) is
// filled by a snapshot from the worker; deltas the snapshot covers are
// dropped, so no text comes twice.
func (c *chatStream) apply(ctx context.Context, d batonnats.LiveDelta) {
	if d.Seq <= c.reply.Seq {
		return
	}
	if d.Seq != c.reply.Seq+1 || !c.synced && d.Seq != 1 {
		c.snapshot(ctx)
		if d.Seq != c.reply.Seq+1 {
			return
		}
	}
	c.reply.Apply(d)
	c.synced = true
	c.out.sync(c.reply.Parts)
}

// snapshot asks the worker that runs the followed run for the reply so
// far, at most once every snapshotEvery, and shows it.
func (c *chatStream) snapshot(ctx context.Context) {
	nc := c.s.nc
	if nc == nil || c.run == "" || time.Since(c.lastSnapshot) < snapshotEvery {
		return
	}
	c.lastSnapshot = time.Now()
	rctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, batonnats.SnapshotSubject(c.key, c.run), nil)
	if err != nil {
		return
	}
	var snap batonnats.LiveReply
	if json.Unmarshal(msg.Data, &snap) != nil || snap.RunID != c.run || snap.Seq < c.reply.Seq {
		return
	}
	c.reply, c.synced = snap, true
	c.out.sync(c.reply.Parts)
}

// check reads the row's state, for what the events may not have said.
func (c *chatStream) check(ctx context.Context) {
	t, err := schema.ReadRowTurn(ctx, c.s.pool, c.key, c.row)
	switch {
	case errors.Is(err, schema.ErrNotFound):
		c.out.fail(chatVanishedText)
	case err != nil:
		if ctx.Err() == nil {
			c.s.log.Warn().Err(err).Msg("read the turn a chat stream follows")
		}
	case t.Status == "processing":
		c.begin(ctx, t.RunID, t.RunReplyID, true)
	case t.Status == "pending":
		c.run, c.synced = "", false
		a, err := schema.WaitingApproval(ctx, c.s.pool, c.key, c.row)
		if err != nil {
			if ctx.Err() == nil {
				c.s.log.Warn().Err(err).Msg("read the approval a chat stream's turn waits for")
			}
			return
		}
		if a != nil {
			c.out.awaitApproval(a)
		}
	case t.Settled:
		c.out.settle()
	case t.ReplyID != "":
		c.finish(ctx, t.ReplyID)
	default:
		// Settled long ago, its run pruned: nothing to show.
		c.out.settle()
	}
}

// finish ends the stream with the committed reply or visible error.
func (c *chatStream) finish(ctx context.Context, messageID string) {
	m, err := schema.ChatReply(ctx, c.s.pool, c.key, messageID)
	switch {
	case errors.Is(err, schema.ErrNotFound):
		c.out.fail(chatVanishedText)
	case err != nil:
		if ctx.Err() == nil {
			c.s.log.Warn().Err(err).Msg("read the reply of a chat stream")
		}
		c.err = err
	case m.Role == schema.RoleError:
		c.out.fail(m.Content)
	default:
		c.out.finish(m)
	}
}
