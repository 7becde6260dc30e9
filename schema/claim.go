package schema

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

// TurnID is the logical turn of a set of outbox rows: the same rows always
// make the same turn, whichever run or attempt claims them.
func TurnID(outboxIDs []int64) string { return TurnIDOf(outboxIDs, 0) }

// TurnIDOf is the logical turn of a set of outbox rows at a generation:
// a regenerated reply answers the same rows again in a turn of its own
// (generation 0 is TurnID's).
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

// ReplyID is the ID of the assistant reply of a turn over outboxIDs at a
// generation. It is derived from the turn's oldest row and the generation,
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
	// pending for the next turn (Claim.More). Zero means no cap.
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
	// FirstCreatedAt is when the oldest row of the turn was inserted.
	FirstCreatedAt time.Time
	LeaseExpiresAt time.Time
	// Recovered is set when an expired run held the conversation and was
	// recovered inside this claim's transaction.
	Recovered *Recovery
	// More is set when pending rows were left for the next turn by
	// ClaimParams.MaxRows.
	More bool
	// TraceParents are the trace contexts the claimed rows kept (ClaimTurn
	// only): a turn that answers several requests links their traces.
	TraceParents []string
	// Resume, when set, is the decided approval the turn resumes from: it
	// claimed exactly the rows of the turn that stopped for it.
	Resume *Resume
}

// Empty reports whether nothing was claimed: no pending rows.
func (c Claim) Empty() bool { return len(c.OutboxIDs) == 0 }

// ReplyID is the ID the turn's reply gets (see ReplyID).
func (c Claim) ReplyID() string { return ReplyID(c.OutboxIDs, c.Generation) }

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

// ClaimTx claims a conversation's pending rows for one run, in the caller's
// transaction: it takes the conversation lease if no live run holds it
// (recovering an expired holder inline, by the rule of RecoverRunTx), marks
// the pending rows (the oldest MaxRows of them) processing with attempts+1
// and the run ID, and records the run in agent_runs. The caller commits,
// also when the claim is Empty (an inline recovery may have changed rows).
//
// Visibility: logical decoding can hand the relay a commit before that
// commit is visible to other sessions, so a trigger may arrive before its
// outbox row can be seen. The claim's first statement locks the
// conversation row, which the producer (InsertMessageTx) locks and updates
// in the transaction that inserts the outbox row: the lock is held until
// that commit is visible, so the claim waits for it and then sees the row.
// Every path that announces rows does so in a transaction that changed
// those rows after they were committed and visible (recovery, the sweeper,
// a user's retry, all under the same row lock or on rows already
// committed), so the rule holds for each.
//
// A live owner is a *BusyError (errors.Is ErrConversationBusy); a missing
// conversation is ErrConversationDeleted.
func ClaimTx(ctx context.Context, tx Executor, p ClaimParams) (Claim, error) {
	if p.Lease <= 0 {
		return Claim{}, errors.New("claim: lease must be positive")
	}
	// The row lock serializes claims, finalizes and recoveries of one
	// conversation across processes: a plain select followed by an update
	// would let two workers take the same rows.
	var owner *string
	var expires, notBefore *time.Time
	var expired, gone, waiting bool
	var approvalID *int64
	err := tx.QueryRow(ctx, `
		SELECT run_id, lease_expires_at, COALESCE(lease_expires_at <= now(), false),
			not_before, COALESCE(not_before > now(), false), approval_id
		FROM conversations WHERE id = $1 FOR UPDATE`, p.ConversationID).Scan(&owner, &expires, &expired, &notBefore, &waiting, &approvalID)
	if err == nil && owner != nil && !expired {
		gone, err = runSessionGone(ctx, tx, *owner)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, ErrConversationDeleted
	}
	if err != nil {
		return Claim{}, fmt.Errorf("claim: lock conversation: %w", err)
	}
	c := Claim{RunID: p.RunID, ConversationID: p.ConversationID}
	if owner != nil {
		reason := RecoveryReasonLeaseExpired
		switch {
		case gone:
			reason = RecoveryReasonSessionEnded
		case !expired:
			return Claim{}, &BusyError{RunID: *owner, LeaseExpiresAt: *expires}
		}
		rec, err := recoverRunTx(ctx, tx, p.ConversationID, *owner, p.MaxAttempts, reason)
		if err != nil {
			return Claim{}, err
		}
		c.Recovered = &rec
	} else if waiting {
		return Claim{}, &WaitError{NotBefore: *notBefore}
	}
	if c.Recovered != nil {
		// The recovery may have ended the turn that resumed an approval.
		if err := tx.QueryRow(ctx, `SELECT approval_id FROM conversations WHERE id = $1`, p.ConversationID).Scan(&approvalID); err != nil {
			return Claim{}, fmt.Errorf("claim: read approval: %w", err)
		}
	}
	if approvalID != nil {
		resumed, err := claimResumeTx(ctx, tx, &c, p, *approvalID)
		if err != nil || resumed {
			return c, err
		}
	}
	limit := int64(p.MaxRows)
	if limit <= 0 {
		limit = -1
	}
	rows, err := tx.Query(ctx, `
		WITH turn AS (
			SELECT id FROM agent_outbox
			WHERE conversation_id = $1 AND status = 'pending'
			ORDER BY id
			LIMIT CASE WHEN $3::bigint < 0 THEN NULL ELSE $3::bigint + 1 END)
		UPDATE agent_outbox o
		SET status = 'processing', attempts = attempts + 1, run_id = $2
		FROM (SELECT id FROM turn ORDER BY id LIMIT CASE WHEN $3::bigint < 0 THEN NULL ELSE $3::bigint END) t
		WHERE o.id = t.id
		RETURNING o.id, o.attempts, o.created_at, o.generation, (SELECT count(*) FROM turn)`, p.ConversationID, p.RunID, limit)
	if err != nil {
		return Claim{}, fmt.Errorf("claim: mark rows processing: %w", err)
	}
	for rows.Next() {
		var id, pending int64
		var attempts, generation int
		var created time.Time
		if err := rows.Scan(&id, &attempts, &created, &generation, &pending); err != nil {
			rows.Close()
			return Claim{}, err
		}
		c.More = limit >= 0 && pending > limit
		c.OutboxIDs = append(c.OutboxIDs, id)
		c.Attempts = max(c.Attempts, attempts)
		c.Generation = max(c.Generation, generation)
		if c.FirstCreatedAt.IsZero() || created.Before(c.FirstCreatedAt) {
			c.FirstCreatedAt = created
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Claim{}, fmt.Errorf("claim: mark rows processing: %w", err)
	}
	if c.Empty() {
		return c, nil
	}
	return c, takeLeaseTx(ctx, tx, &c, p)
}

// takeLeaseTx takes the conversation's lease for a claim that took rows,
// and records its run.
func takeLeaseTx(ctx context.Context, tx Executor, c *Claim, p ClaimParams) error {
	slices.Sort(c.OutboxIDs)
	c.TurnID = TurnIDOf(c.OutboxIDs, c.Generation)
	// clock_timestamp, not now(): the transaction may have waited for the
	// conversation lock behind the previous run's finalize, and the record
	// of runs must show that this one started after that one ended.
	err := tx.QueryRow(ctx, `
		WITH lease AS (
			UPDATE conversations
			SET run_id = $2, lease_expires_at = clock_timestamp() + make_interval(secs => $3), not_before = NULL
			WHERE id = $1
			RETURNING lease_expires_at)
		INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, worker_session, started_at, lease_expires_at)
		SELECT $2, $1, $4, $5, $6, nullif($7::integer, 0), clock_timestamp(), lease_expires_at FROM lease
		RETURNING lease_expires_at`,
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
			c.Resume = r
			return true, takeLeaseTx(ctx, tx, c, p)
		}
		// The rows say the turn cannot resume: forget the approval.
	}
	if _, err := tx.Exec(ctx, `UPDATE conversations SET approval_id = NULL WHERE id = $1`, p.ConversationID); err != nil {
		return false, fmt.Errorf("claim: forget approval: %w", err)
	}
	return false, nil
}

// TurnInput is the content of a claimed turn.
type TurnInput struct {
	// Messages are the user messages of the claimed rows, in order.
	Messages []Message
	// History is what the conversation said before the turn, oldest first,
	// at most the requested number of messages: replies, errors and the
	// user messages of earlier turns, never those waiting for a later turn
	// nor replies a regenerated one replaced.
	History []Message
}

// LoadTurn loads the messages of exactly the claimed outbox rows, and up to
// historyLimit earlier messages of the conversation.
func LoadTurn(ctx context.Context, db Executor, conversationID string, outboxIDs []int64, historyLimit int) (TurnInput, error) {
	var in TurnInput
	rows, err := db.Query(ctx, `
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq
		FROM agent_outbox o JOIN messages m ON m.id = o.message_id
		WHERE o.id = ANY($1) AND o.conversation_id = $2
		ORDER BY m.seq`, outboxIDs, conversationID)
	if err != nil {
		return in, fmt.Errorf("load turn messages: %w", err)
	}
	in.Messages, err = scanMessages(rows)
	if err != nil {
		return in, fmt.Errorf("load turn messages: %w", err)
	}
	if len(in.Messages) == 0 {
		return in, ErrConversationDeleted
	}
	if historyLimit <= 0 {
		return in, nil
	}
	rows, err = db.Query(ctx, `
		SELECT id, conversation_id, role, content, created_at, seq FROM (
			SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq
			FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
			WHERE m.conversation_id = $1 AND (o.id IS NULL OR o.status IN ('done', 'error')) AND m.superseded_at IS NULL
			ORDER BY m.seq DESC LIMIT $2) h
		ORDER BY seq`, conversationID, historyLimit)
	if err != nil {
		return in, fmt.Errorf("load history: %w", err)
	}
	in.History, err = scanMessages(rows)
	if err != nil {
		return in, fmt.Errorf("load history: %w", err)
	}
	return in, nil
}

// LoadHistoryBefore loads up to limit messages of the conversation said
// before the message whose Seq is beforeSeq, newest first, without those
// waiting for a later turn: what an agent whose context budget has room
// for more than LoadTurn's history reads, a page at a time.
func LoadHistoryBefore(ctx context.Context, db Executor, conversationID string, beforeSeq int64, limit int) ([]Message, error) {
	rows, err := db.Query(ctx, `
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND m.seq < $2 AND (o.id IS NULL OR o.status IN ('done', 'error')) AND m.superseded_at IS NULL
		ORDER BY m.seq DESC LIMIT $3`, conversationID, beforeSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	return scanMessages(rows)
}

func scanMessages(rows pgx.Rows) ([]Message, error) {
	defer rows.Close()
	var out []Message
	for rows.Next() {
		var m Message
		if err := rows.Scan(&m.ID, &m.ConversationID, &m.Role, &m.Content, &m.CreatedAt, &m.Seq); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
