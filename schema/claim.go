package schema

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Errors of the turn lifecycle. Claim, finalize and lease renewal translate
// the state they find into these, so a consumer decides on domain terms.
var (
	// ErrConversationBusy: a live run holds the conversation's lease. The
	// trigger must be delayed and looked at again, never dropped.
	ErrConversationBusy = errors.New("conversation is owned by another run")
	// ErrConversationDeleted: the conversation is gone, with its rows; the
	// turn is cancelled and its result discarded.
	ErrConversationDeleted = errors.New("conversation was deleted")
	// ErrLeaseLost: the run no longer owns the conversation (its lease
	// expired and was recovered). Finalize is fenced by this.
	ErrLeaseLost = errors.New("run no longer owns the conversation")
	// ErrRunAlone: a claim or finalize of a batch that does not wait
	// (ClaimTurnsNoWait, FinalizeTurnsNoWait) did nothing for this turn,
	// because it would have waited: another transaction holds the
	// conversation, or the turn needs a transaction of its own (recovering
	// an expired run, handing back a superseded turn). Claim or finalize it
	// again on its own, with ClaimTurn or FinalizeTurn.
	ErrRunAlone = errors.New("the turn needs a claim or finalize of its own")
	// ErrLockWait: ClaimTurnWithin waited as long as it was given for a
	// lock another transaction holds, and claimed nothing.
	ErrLockWait = errors.New("the conversation stayed locked by another transaction")
)

// TurnID is the logical turn of a set of outbox rows, as it was derived
// before a conversation's ids were salted: the same rows always make the
// same turn, whichever run or attempt claims them. Turns whose oldest row
// came later hash the same text with their conversation's secret salt
// (TurnIDs, the SQL function baton_turn_id of migration 00026), so that
// no id says how many messages the server holds.
func TurnID(outboxIDs []int64) string { return TurnIDOf(outboxIDs, 0) }

// TurnIDOf is the unsalted logical turn of a set of outbox rows at a
// generation: a regenerated reply answers the same rows again in a turn
// of its own (generation 0 is TurnID's). See TurnID.
func TurnIDOf(outboxIDs []int64, generation int) string {
	ids := slices.Clone(outboxIDs)
	slices.Sort(ids)
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	if generation > 0 {
		b.WriteString("#" + strconv.Itoa(generation))
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "turn_" + hex.EncodeToString(sum[:16])
}

// ReplyID is the unsalted ID of the assistant reply of a turn over
// outboxIDs at a generation: the ID of a turn whose oldest row predates
// the salt (see TurnID; TurnIDs gives the ID a claim derives). It is
// derived from the turn's oldest row and the generation,
// not from the whole set: a turn that a newer message supersedes is
// answered by a turn over its rows and the newer ones, whose reply keeps
// the same ID, so a client that streams the reply never sees its ID
// change. A unique key on messages.id makes a second reply impossible:
// the oldest row of a turn is the oldest pending row of its conversation,
// and only a finalize, which marks it done, writes its reply; it becomes
// pending again only after a failure (no reply) or a regenerate (one more
// generation).
func ReplyID(outboxIDs []int64, generation int) string {
	if len(outboxIDs) == 0 {
		return ""
	}
	sum := sha256.Sum256([]byte("reply:" + strconv.FormatInt(slices.Min(outboxIDs), 10) + "#" + strconv.Itoa(generation)))
	return "reply_" + hex.EncodeToString(sum[:16])
}

// ErrorMessageID is the ID of the visible error message of the run that
// gave up. It is the run's, not the turn's: after a user's retry the same
// rows can fail again, in another run, and that failure is shown too.
// Only the run that owns the conversation writes it (the write is fenced),
// and it gives up once.
func ErrorMessageID(runID string) string { return "error_" + strings.TrimPrefix(runID, "run_") }

// TurnIDs returns the turn id and the reply id of a turn over outbox rows
// of the conversation with the given key at a generation, as the claim
// derives them: salted with the conversation's secret when the oldest row
// is (every row inserted since migration 00026), TurnIDOf and ReplyID
// otherwise.
func TurnIDs(ctx context.Context, db Executor, conversationKey string, outboxIDs []int64, generation int) (turnID, replyID string, err error) {
	err = db.QueryRow(ctx, `SELECT baton_turn_id($1, $2, $3), baton_reply_id($1, $2, $3)`, conversationKey, outboxIDs, generation).
		Scan(&turnID, &replyID)
	if err != nil {
		return "", "", fmt.Errorf("derive the turn's ids: %w", err)
	}
	return turnID, replyID, nil
}

// ClaimParams say who claims which conversation for how long.
type ClaimParams struct {
	ConversationID string
	// RunID names this attempt; it owns the lease, the rows and the
	// operations of the turn.
	RunID string
	// Worker names the process, for agent_runs.
	Worker string
	// Lease is how long the claim holds without renewal.
	Lease time.Duration
	// MaxAttempts caps attempts when an expired run is recovered inline.
	MaxAttempts int
	// MaxRows caps the rows of one turn, oldest first; the rest stay
	// pending for the next turn (Claim.More). Zero means no cap. A
	// conversation whose double texting is DoubleTextingEnqueue is capped
	// at one row whatever this says.
	MaxRows int
	// Session is the worker's session (see TakeWorkerSession), recorded
	// on the run: while the worker lives its session's lock is held, and
	// once the lock is free the run may be taken over before its lease
	// expires. Zero records none: the run is left to its lease.
	Session int32
}

// Claim is the outcome of ClaimTx.
type Claim struct {
	RunID          string
	ConversationID string
	// TurnID is derived from OutboxIDs (see TurnID).
	TurnID string
	// OutboxIDs are the exact rows of the turn, ascending: the claimed set
	// defines the turn, not "whatever is pending now".
	OutboxIDs []int64
	// Attempts is the highest attempt count among the rows, this attempt
	// included.
	Attempts int
	// Generation is the highest generation among the rows: how many times
	// the newest reply to them was regenerated. It is part of the turn's
	// identity.
	Generation int
	// Epoch is the highest retry epoch among the rows: how many times a
	// user retried them after they failed. The turn's journaled steps are
	// those of its epoch (see LoadSteps).
	Epoch int
	// Owner is the name of the user the conversation belongs to.
	Owner string
	// Journaled is set when the turn has steps in its journal (see
	// LoadSteps): it goes on from them.
	Journaled bool
	// FirstCreatedAt is when the oldest row of the turn was inserted.
	FirstCreatedAt time.Time
	LeaseExpiresAt time.Time
	// Recovered is set when an expired run held the conversation and was
	// recovered inside this claim's transaction.
	Recovered *Recovery
	// More is set when pending rows were left for the next turn by
	// ClaimParams.MaxRows, or by the one-message turns of a conversation
	// that enqueues.
	More bool
	// DoubleTexting is the conversation's policy when it was claimed:
	// under DoubleTextingDebounce alone may a newer message supersede
	// the turn.
	DoubleTexting DoubleTexting
	// TraceParents are the trace contexts the claimed rows kept (none for
	// a resumed turn): a turn that answers several requests links their
	// traces.
	TraceParents []string
	// Resume, when set, is the decided approval the turn resumes from: it
	// claimed exactly the rows of the turn that stopped for it.
	Resume *Resume
	// replyID is the ID the turn's reply gets, as the claim derived it.
	replyID string
}

// Empty reports whether nothing was claimed: no pending rows.
func (c Claim) Empty() bool { return len(c.OutboxIDs) == 0 }

// ReplyID is the ID the turn's reply gets (see TurnIDs); finalize derives
// the same.
func (c Claim) ReplyID() string {
	if c.replyID == "" && len(c.OutboxIDs) > 0 {
		// A claim made by hand, not by ClaimTx: the unsalted derivation.
		return ReplyID(c.OutboxIDs, c.Generation)
	}
	return c.replyID
}

// BusyError is ErrConversationBusy with the owner and its lease.
type BusyError struct {
	RunID          string
	LeaseExpiresAt time.Time
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("%s: run %s until %s", ErrConversationBusy, e.RunID, e.LeaseExpiresAt.Format(time.RFC3339Nano))
}

func (e *BusyError) Unwrap() error { return ErrConversationBusy }

// ErrConversationWaiting: the model server asked the conversation's turn
// to wait (Retry-After); nothing may be claimed before then.
var ErrConversationWaiting = errors.New("conversation waits for the model server")

// WaitError is ErrConversationWaiting with the time the wait ends.
type WaitError struct {
	NotBefore time.Time
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("%s until %s", ErrConversationWaiting, e.NotBefore.Format(time.RFC3339Nano))
}

func (e *WaitError) Unwrap() error { return ErrConversationWaiting }

// claimSQL is the claim, in one statement, for any number of
// conversations: lock them (in the order of their IDs, as every statement
// that locks several conversations does, so that two never wait for each
// other), and for each one found free (no run holds it, no wait, no turn
// stopped at an approval) take its oldest pending rows (at most its
// max_rows, or all when that is negative), mark them processing, take the
// lease, record the run, and read the turn's messages and the history
// before it. It returns one row per requested conversation, in the order
// asked (ord), with the state it found. ClaimTx runs it in the caller's
// transaction for one conversation, ClaimTurns in a transaction of its
// own for many.
//
// Data-modifying CTEs see the statement's snapshot, in which the claimed
// rows are still pending: the history, which keeps only rows done or
// failed, leaves them out as it must. When a conversation is held, waits
// or is parked at an approval, nothing is written for it and its row says
// why.
//
// The snapshot predates the wait for the conversations' locks: a run may
// have claimed and finished rows in between, which the snapshot still
// shows pending. The UPDATE checks the status again on the row it changes
// (a changed row is re-read under READ COMMITTED), so a row another run
// took is never taken twice; the turn CTE alone would not see that. Rows
// committed during the wait are not seen at all: see ClaimTx.
const claimSQL = `
WITH req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::text[], $7::integer[]) WITH ORDINALITY
		AS r(conversation_id, run_id, lease_secs, max_rows, worker, session, ord)),
conv AS (
	SELECT c.id, c.run_id, c.lease_expires_at, coalesce(c.lease_expires_at <= now(), false) AS expired,
		CASE WHEN c.run_id IS NULL OR c.lease_expires_at <= now() THEN false ELSE baton_run_session_gone(c.run_id) END AS gone,
		c.not_before, coalesce(c.not_before > now(), false) AS waiting, c.approval_id, c.double_texting,
		(SELECT u.name FROM users u WHERE u.id = c.owner_id) AS owner_name
	FROM conversations c WHERE c.id = ANY($1) ORDER BY c.id FOR UPDATE),
free AS (
	-- A conversation that enqueues double texts answers one message per
	-- turn.
	SELECT r.conversation_id, r.run_id, CASE WHEN conv.double_texting = 'enqueue' THEN 1 ELSE r.max_rows END AS max_rows
	FROM req r JOIN conv ON conv.id = r.conversation_id
	WHERE conv.run_id IS NULL AND NOT conv.waiting AND conv.approval_id IS NULL),
turn AS (
	SELECT f.conversation_id, f.run_id, f.max_rows, t.id, t.rn FROM free f CROSS JOIN LATERAL (
		SELECT o.id, row_number() OVER (ORDER BY o.id) AS rn FROM agent_outbox o
		WHERE o.conversation_id = f.conversation_id AND o.status = 'pending'
			-- A turn with journaled steps is claimed alone, with exactly its
			-- rows, and goes on from its journal.
			AND o.steps_turn_id IS NOT DISTINCT FROM (SELECT p.steps_turn_id FROM agent_outbox p
				WHERE p.conversation_id = f.conversation_id AND p.status = 'pending' ORDER BY p.id LIMIT 1)
		ORDER BY o.id
		LIMIT CASE WHEN f.max_rows < 0 THEN NULL ELSE f.max_rows + 1 END) t),
claimed AS (
	UPDATE agent_outbox o SET status = 'processing', attempts = o.attempts + 1, run_id = t.run_id
	FROM turn t WHERE o.id = t.id AND (t.max_rows < 0 OR t.rn <= t.max_rows) AND o.status = 'pending'
	RETURNING o.id, o.conversation_id, o.attempts, o.created_at, o.message_id, o.trace_parent, o.generation, o.epoch, o.steps_turn_id),
agg AS (
	-- A journaled turn keeps the id its steps were journaled under,
	-- whichever version of Baton derived it.
	SELECT conversation_id, array_agg(id ORDER BY id) AS ids,
		array_agg(coalesce(trace_parent, '') ORDER BY id) AS trace_parents,
		coalesce(max(steps_turn_id), baton_turn_id(conversation_id, array_agg(id), max(generation))) AS turn_id,
		baton_reply_id(conversation_id, array_agg(id), max(generation)) AS reply_id,
		max(attempts) AS attempts, max(generation) AS generation, max(epoch) AS epoch, bool_or(steps_turn_id IS NOT NULL) AS journaled,
		min(created_at) AS first_created_at
	FROM claimed GROUP BY conversation_id),` + leaseRunSQL + `
SELECT r.ord, conv.id IS NOT NULL, EXISTS (SELECT 1 FROM conversations x WHERE x.id = r.conversation_id),
	conv.run_id, conv.lease_expires_at, coalesce(conv.expired, false), coalesce(conv.gone, false),
	conv.not_before, coalesce(conv.waiting, false), conv.approval_id,
	agg.ids, agg.trace_parents, agg.turn_id, agg.reply_id, agg.attempts, agg.generation, agg.epoch, coalesce(agg.journaled, false), conv.owner_name, agg.first_created_at, run.lease_expires_at,
	(SELECT count(*) FROM turn WHERE turn.conversation_id = r.conversation_id),
	coalesce(conv.double_texting, ''), (SELECT f.max_rows FROM free f WHERE f.conversation_id = r.conversation_id AND f.run_id = r.run_id),
	(SELECT json_agg(json_build_object('id', m.id, 'conversation_id', m.conversation_id, 'role', m.role,
		'content', m.content, 'created_at', m.created_at, 'seq', m.seq) ORDER BY m.seq)
	 FROM messages m JOIN claimed c ON c.message_id = m.id WHERE c.conversation_id = r.conversation_id),
	(SELECT json_agg(h ORDER BY h.seq) FROM (
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = r.conversation_id AND (o.id IS NULL OR o.status IN ('done', 'error')) AND m.superseded_at IS NULL AND agg.ids IS NOT NULL
		ORDER BY m.seq DESC LIMIT $6) h)
FROM req r
LEFT JOIN conv ON conv.id = r.conversation_id
LEFT JOIN agg ON agg.conversation_id = r.conversation_id
LEFT JOIN run ON run.conversation_id = r.conversation_id
ORDER BY r.ord`

// leaseRunSQL takes the lease of each conversation of a claimed turn and
// records the run: its CTEs read the turn from agg (conversation_id, ids,
// turn_id) and the claim from req (conversation_id, run_id, lease_secs,
// worker, session), and run returns each lease's expiry. claimSQL and a
// resumed turn's claim (takeLeaseTx) share it.
//
// clock_timestamp, not now(): the transaction may have waited for the
// conversation lock behind the previous run's finalize, and the record of
// runs must show that this one started after that one ended.
const leaseRunSQL = `
lease AS (
	UPDATE conversations c
	SET run_id = r.run_id, lease_expires_at = clock_timestamp() + make_interval(secs => r.lease_secs), not_before = NULL
	FROM agg JOIN req r ON r.conversation_id = agg.conversation_id
	WHERE c.id = agg.conversation_id
	RETURNING c.id, c.lease_expires_at),
run AS (
	INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, worker_session, started_at, lease_expires_at)
	SELECT r.run_id, r.conversation_id, agg.turn_id, agg.ids, r.worker, nullif(r.session, 0), clock_timestamp(), lease.lease_expires_at
	FROM agg JOIN req r ON r.conversation_id = agg.conversation_id JOIN lease ON lease.id = agg.conversation_id
	RETURNING conversation_id, lease_expires_at)`

// claimNoWaitSQL is claimSQL that skips the conversations whose row
// another transaction holds instead of waiting for them: their rows show
// the conversation in the statement's snapshot but not locked.
var claimNoWaitSQL = noWait(claimSQL, "ORDER BY c.id FOR UPDATE)")

// claimRow is one conversation's row of claimSQL.
type claimRow struct {
	exists, inSnapshot       bool
	owner                    *string
	expires, notBefore       *time.Time
	expired, gone, waiting   bool
	approvalID               *int64
	ids                      []int64
	traceParents             []string
	turnID, replyID          *string
	attempts, generation     *int
	epoch                    *int
	journaled                bool
	ownerName                *string
	firstCreated, leaseUntil *time.Time
	pending                  int64
	policy                   string
	maxRows                  *int64
	messages, history        []byte
}

// free reports whether the statement found the conversation free, and so
// claimed whatever was pending.
func (r claimRow) free() bool {
	return r.exists && r.owner == nil && !r.waiting && r.approvalID == nil
}

// takeover reports whether a run holds the conversation that may be
// taken over: its lease expired, or its worker's session ended. Its
// recovery comes first (ClaimTx).
func (r claimRow) takeover() bool { return r.exists && r.owner != nil && (r.expired || r.gone) }

// parked reports whether the conversation's turn stopped at an approval:
// ClaimTx resumes it, or says that it still waits.
func (r claimRow) parked() bool {
	return r.exists && r.owner == nil && !r.waiting && r.approvalID != nil
}

// claimScan runs claimSQL (claimNoWaitSQL with skipLocked) for the claims
// ps[i] of which, returning their rows in that order.
func claimScan(ctx context.Context, db Executor, ps []ClaimParams, which []int, historyLimit int, skipLocked bool) ([]claimRow, error) {
	n := len(which)
	convs, runs, workers := make([]string, n), make([]string, n), make([]string, n)
	sessions := make([]int32, n)
	leases := make([]float64, n)
	limits := make([]int64, n)
	for k, i := range which {
		p := ps[i]
		convs[k], runs[k], workers[k], leases[k] = p.ConversationID, p.RunID, p.Worker, p.Lease.Seconds()
		sessions[k] = p.Session
		limits[k] = int64(p.MaxRows)
		if limits[k] <= 0 {
			limits[k] = -1
		}
	}
	query := claimSQL
	if skipLocked {
		query = claimNoWaitSQL
	}
	rows, err := db.Query(ctx, query, convs, runs, leases, limits, workers, max(historyLimit, 0), sessions)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]claimRow, n)
	for rows.Next() {
		var ord int64
		var r claimRow
		if err := rows.Scan(&ord, &r.exists, &r.inSnapshot, &r.owner, &r.expires, &r.expired, &r.gone, &r.notBefore, &r.waiting, &r.approvalID,
			&r.ids, &r.traceParents, &r.turnID, &r.replyID, &r.attempts, &r.generation, &r.epoch, &r.journaled, &r.ownerName, &r.firstCreated, &r.leaseUntil,
			&r.pending, &r.policy, &r.maxRows, &r.messages, &r.history); err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(n) {
			return nil, fmt.Errorf("claim: row %d of %d requested", ord, n)
		}
		out[ord-1] = r
	}
	return out, rows.Err()
}

// claim is the claim of p that its row says, for a row that leaves
// nothing to ClaimTx's own steps (neither takeover nor parked): the
// claimed turn and its content, nothing when nothing was pending, or why
// the conversation could not be claimed.
func (r claimRow) claim(p ClaimParams) (Claim, TurnInput, error) {
	switch {
	case !r.exists:
		return Claim{}, TurnInput{}, ErrConversationDeleted
	case r.owner != nil:
		return Claim{}, TurnInput{}, &BusyError{RunID: *r.owner, LeaseExpiresAt: *r.expires}
	case r.waiting:
		return Claim{}, TurnInput{}, &WaitError{NotBefore: *r.notBefore}
	}
	c := Claim{RunID: p.RunID, ConversationID: p.ConversationID, DoubleTexting: DoubleTexting(r.policy)}
	var in TurnInput
	if len(r.ids) == 0 {
		return c, in, nil
	}
	c.OutboxIDs, c.TurnID, c.replyID, c.Attempts, c.Generation, c.Epoch = r.ids, *r.turnID, *r.replyID, *r.attempts, *r.generation, *r.epoch
	c.Journaled = r.journaled
	if r.ownerName != nil {
		c.Owner = *r.ownerName
	}
	for _, tp := range r.traceParents {
		if tp != "" {
			c.TraceParents = append(c.TraceParents, tp)
		}
	}
	c.FirstCreatedAt, c.LeaseExpiresAt = *r.firstCreated, *r.leaseUntil
	// The cap the statement applied: the claim's, or one message for a
	// conversation that enqueues.
	c.More = r.maxRows != nil && *r.maxRows > 0 && r.pending > *r.maxRows
	if err := json.Unmarshal(r.messages, &in.Messages); err != nil {
		return c, in, fmt.Errorf("claim: read the turn's messages: %w", err)
	}
	if len(r.history) > 0 {
		if err := json.Unmarshal(r.history, &in.History); err != nil {
			return c, in, fmt.Errorf("claim: read the history: %w", err)
		}
	}
	if len(in.Messages) == 0 {
		// The conversation went between the claim and the read: it cannot
		// within one statement, but a turn without messages must never run.
		return c, in, ErrConversationDeleted
	}
	return c, in, nil
}

// ClaimTx claims a conversation's pending rows for one run, in the caller's
// transaction: it takes the conversation lease if no live run holds it
// (recovering an expired holder, or one whose worker's session ended,
// inline, by the rule of RecoverRunTx), marks the pending rows (the oldest
// MaxRows of them) processing with attempts+1 and the run ID, and records
// the run in agent_runs. A conversation whose turn stopped at an approval
// resumes that turn once the approval is decided (Claim.Resume). The
// caller commits, also when the claim is Empty (an inline recovery may
// have changed rows).
//
// A free conversation costs one statement, claimSQL, the one ClaimTurns
// sends for many: recovering a run and resuming an approval are steps of
// their own before it.
//
// Visibility: logical decoding can hand the relay a commit before that
// commit is visible to other sessions, so a trigger may arrive before its
// outbox row can be seen. The claim locks the conversation row, which the
// producer (InsertMessageTx) locks and updates in the transaction that
// inserts the outbox row: the lock is held until that commit is visible.
// The statement that waited for the lock has an older snapshot, though,
// and may not see the row: when it finds the conversation free with
// nothing pending, the claim looks once more, in a statement whose
// snapshot follows the wait. Every path that announces rows does so in a
// transaction that changed those rows after they were committed and
// visible (recovery, the sweeper, a user's retry, all under the same row
// lock or on rows already committed), so the rule holds for each.
//
// A live owner is a *BusyError (errors.Is ErrConversationBusy), a wait
// the model server asked for a *WaitError, an approval not yet decided an
// *ApprovalWaitError; a missing conversation is ErrConversationDeleted.
func ClaimTx(ctx context.Context, tx Executor, p ClaimParams) (Claim, error) {
	c, _, err := claimTx(ctx, tx, p, 0, false)
	return c, err
}

// claimTx is ClaimTx that, with load, also returns the turn's content:
// the messages of exactly the claimed rows and up to historyLimit earlier
// ones.
func claimTx(ctx context.Context, tx Executor, p ClaimParams, historyLimit int, load bool) (Claim, TurnInput, error) {
	if p.Lease <= 0 {
		return Claim{}, TurnInput{}, errors.New("claim: lease must be positive")
	}
	scan := func() (claimRow, error) {
		rows, err := claimScan(ctx, tx, []ClaimParams{p}, []int{0}, historyLimit, false)
		if err != nil {
			return claimRow{}, fmt.Errorf("claim: %w", err)
		}
		return rows[0], nil
	}
	r, err := scan()
	if err == nil && r.free() && len(r.ids) == 0 {
		// Visibility (see above): the conversation's lock is this
		// transaction's now, so this statement sees every commit that
		// held it.
		r, err = scan()
	}
	if err != nil {
		return Claim{}, TurnInput{}, err
	}
	var recovered *Recovery
	if r.takeover() {
		reason := RecoveryReasonLeaseExpired
		if r.gone {
			reason = RecoveryReasonSessionEnded
		}
		rec, err := recoverRunTx(ctx, tx, p.ConversationID, *r.owner, p.MaxAttempts, reason)
		if err != nil {
			return Claim{}, TurnInput{}, err
		}
		recovered = &rec
		// The recovery released the conversation, and may have ended the
		// turn that resumed an approval.
		if r, err = scan(); err != nil {
			return Claim{}, TurnInput{}, err
		}
	}
	if r.parked() {
		c := Claim{RunID: p.RunID, ConversationID: p.ConversationID, Recovered: recovered, DoubleTexting: DoubleTexting(r.policy)}
		resumed, err := claimResumeTx(ctx, tx, &c, p, *r.approvalID)
		if err != nil {
			return c, TurnInput{}, err
		}
		if resumed {
			var in TurnInput
			if load {
				in, err = LoadTurn(ctx, tx, p.ConversationID, c.OutboxIDs, historyLimit)
			}
			return c, in, err
		}
		// The approval is forgotten: the conversation is free.
		if r, err = scan(); err != nil {
			return Claim{}, TurnInput{}, err
		}
	}
	c, in, err := r.claim(p)
	c.Recovered = recovered
	return c, in, err
}

// takeLeaseTx takes the conversation's lease for a resumed turn, whose
// rows claimResumeRowsTx took, and records its run (leaseRunSQL). The
// turn keeps the id of the turn that stopped (c.TurnID); its reply gets
// the id its rows derive.
func takeLeaseTx(ctx context.Context, tx Executor, c *Claim, p ClaimParams) error {
	slices.Sort(c.OutboxIDs)
	turnID, replyID, err := TurnIDs(ctx, tx, p.ConversationID, c.OutboxIDs, c.Generation)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if c.TurnID == "" {
		c.TurnID = turnID
	}
	c.replyID = replyID
	err = tx.QueryRow(ctx, `
		WITH req AS (
			SELECT $1::text AS conversation_id, $2::text AS run_id, $3::float8 AS lease_secs, $6::text AS worker, $7::integer AS session),
		agg AS (SELECT $1::text AS conversation_id, $4::text AS turn_id, $5::bigint[] AS ids),`+leaseRunSQL+`
		SELECT lease_expires_at FROM run`,
		p.ConversationID, p.RunID, p.Lease.Seconds(), c.TurnID, c.OutboxIDs, p.Worker, p.Session).Scan(&c.LeaseExpiresAt)
	if err != nil {
		return fmt.Errorf("claim: take lease and record run: %w", err)
	}
	return nil
}

// claimResumeTx claims the turn that stopped at the approval the
// conversation names, once it is decided: exactly that turn's rows, with
// the approval to resume from. A pending approval is an
// *ApprovalWaitError. It reports false, having forgotten the approval,
// when the stopped turn cannot resume (its rows are gone or taken): the
// claim then goes on as usual.
func claimResumeTx(ctx context.Context, tx Executor, c *Claim, p ClaimParams, approvalID int64) (bool, error) {
	r, err := resumeTx(ctx, tx, approvalID)
	if err != nil {
		return false, err
	}
	if r != nil {
		ok, err := claimResumeRowsTx(ctx, tx, c, p.ConversationID, r.OutboxIDs, r.TurnID)
		if err != nil {
			return false, err
		}
		if ok {
			c.Resume, c.TurnID = r, r.TurnID
			return true, takeLeaseTx(ctx, tx, c, p)
		}
		// The rows say the turn cannot resume: forget the approval.
	}
	if _, err := tx.Exec(ctx, `UPDATE conversations SET approval_id = NULL WHERE id = $1`, p.ConversationID); err != nil {
		return false, fmt.Errorf("claim: forget approval: %w", err)
	}
	return false, nil
}
