package schema

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Finalize is the end of a successful turn.
type Finalize struct {
	ConversationID string
	RunID          string
	TurnID         string
	OutboxIDs      []int64
	// Generation is the claim's (Claim.Generation): the reply's ID
	// derives from OutboxIDs and Generation, as the claim's does (see
	// TurnIDs).
	Generation int
	// Content of the assistant reply.
	Content string
	// Reasoning is the reply's reasoning, kept with it and shown apart
	// from its text; empty (stored as NULL) when the agent showed none.
	Reasoning string
	// Truncated marks a reply the model cut off.
	Truncated bool
	// Stopped marks a reply that a stop ended: Content is what the run had
	// written by then. A run that was asked to stop (StopTx) is finalized
	// as stopped whatever this says, and never superseded.
	Stopped bool
	// SupersedeIfNewer hands the turn back instead (SupersedeTx) when a
	// newer message of the conversation is pending and the run started
	// no write: the next turn answers them together.
	SupersedeIfNewer bool
}

// Finalized says what FinalizeTx committed.
type Finalized struct {
	// MessageID is the reply's ID, derived from the turn.
	MessageID string
	// Operations is how many of the run's operations were attached to it.
	Operations int64
	// Superseded is set when, instead of the reply, the turn was handed
	// back for a newer message (Finalize.SupersedeIfNewer).
	Superseded bool
	// Stopped is set when the reply was committed as stopped: asked for
	// (Finalize.Stopped) or because the run had been asked to stop.
	Stopped bool
	// Interrupted is set when a newer message interrupted the run
	// (DoubleTextingInterrupt) and the run started no write: its stopped
	// reply is kept, marked superseded, and the turn's rows are pending
	// again, with one more generation (the next turn's reply gets an id
	// of its own), for the next turn to answer with the newer messages.
	Interrupted bool
}

// finalizeSQL is the finalize, in one statement, for any number of turns:
// one row per turn, in the order asked (ord); the turns' outbox rows come
// flattened, each with its run. FinalizeTx runs it in the caller's
// transaction for one turn, FinalizeTurns in a transaction of its own for
// many. Every write of a turn is conditioned on its fence: the run still
// owns the conversation (the row lock, taken first and in the order of the
// conversations' IDs, orders it against a recovery, which changes
// ownership only under that lock) and every claimed row is still
// processing for it. Unless its fence holds, nothing is written for a turn,
// and its row says which part failed; the other turns commit regardless.
//
// The reply's ID derives from the turn, so a redelivered trigger can never
// add a second one: a reply that exists already is not written again, and
// its row says so.
const finalizeSQL = `
WITH given AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::bool[], $7::bool[], $10::bool[], $11::text[])
		WITH ORDINALITY AS r(conversation_id, run_id, generation, turn_id, content, truncated, supersede_if_newer, stopped, reasoning, ord)),
ids AS (SELECT * FROM unnest($8::bigint[], $9::text[]) AS i(id, run_id)),
asked AS (
	SELECT g.*, baton_reply_id(g.conversation_id, (SELECT array_agg(i.id) FROM ids i WHERE i.run_id = g.run_id), g.generation) AS message_id
	FROM given g),
owner AS (
	SELECT c.id, c.run_id, c.stop_run_id, c.interrupted_run_id FROM conversations c
	WHERE c.id = ANY($1) AND c.run_id = ANY($2) ORDER BY c.id FOR NO KEY UPDATE),
req AS (
	-- A run that was asked to stop (read from the locked row, as the stop
	-- left it) ends stopped, never superseded. One that a newer message
	-- interrupted gives its rows back, to be answered with it, unless it
	-- started a write.
	SELECT r.conversation_id, r.run_id, r.message_id, r.turn_id, r.content, r.truncated, r.supersede_if_newer,
		r.stopped OR coalesce(o.stop_run_id = r.run_id, false) AS stopped, nullif(r.reasoning, '') AS reasoning,
		coalesce(o.stop_run_id = r.run_id AND o.interrupted_run_id = r.run_id, false) AND NOT ` + wroteSQL + ` AS requeue, r.ord
	FROM asked r LEFT JOIN owner o ON o.id = r.conversation_id AND o.run_id = r.run_id),
held AS (
	SELECT i.run_id, bool_and(o.id IS NOT NULL) AS all_held FROM ids i
	LEFT JOIN agent_outbox o ON o.id = i.id AND o.run_id = i.run_id AND o.status = 'processing'
	GROUP BY i.run_id),
newer AS (
	SELECT r.run_id, r.supersede_if_newer AND NOT r.stopped
		AND EXISTS (SELECT 1 FROM agent_outbox o WHERE o.conversation_id = r.conversation_id AND o.status = 'pending')
		AND NOT ` + wroteSQL + ` AS found
	FROM req r),
fence AS (
	SELECT r.* FROM req r
	JOIN owner ON owner.id = r.conversation_id AND owner.run_id = r.run_id
	JOIN held ON held.run_id = r.run_id
	JOIN newer ON newer.run_id = r.run_id
	WHERE held.all_held AND NOT newer.found),
reply AS (
	-- An interrupted run's reply is superseded by the one the next turn
	-- writes: it stays, but is history no more.
	INSERT INTO messages (id, conversation_id, role, content, reasoning, truncated, stopped, run_id, turn_id, superseded_at)
	SELECT message_id, conversation_id, 'assistant', content, reasoning, truncated, stopped, run_id, turn_id, CASE WHEN requeue THEN now() END FROM fence
	ON CONFLICT (id) DO NOTHING
	RETURNING id, conversation_id, run_id, stopped, superseded_at IS NOT NULL AS requeued),
done AS (
	-- Given back, as SupersedeTx gives rows back (the attempt did not
	-- fail), with one more generation: the next turn over them has an
	-- identity and a reply id of its own.
	UPDATE agent_outbox o SET status = CASE WHEN reply.requeued THEN 'pending' ELSE 'done' END,
		processed_at = CASE WHEN reply.requeued THEN NULL ELSE now() END,
		run_id = CASE WHEN reply.requeued THEN NULL ELSE o.run_id END,
		attempts = CASE WHEN reply.requeued THEN greatest(o.attempts - 1, 0) ELSE o.attempts END,
		generation = o.generation + CASE WHEN reply.requeued THEN 1 ELSE 0 END,
		steps_turn_id = CASE WHEN reply.requeued THEN NULL ELSE o.steps_turn_id END
	FROM ids i JOIN reply ON reply.run_id = i.run_id
	WHERE o.id = i.id AND o.run_id = i.run_id AND o.status = 'processing'
	RETURNING 1),
conv AS (
	UPDATE conversations c
	SET run_id = NULL, lease_expires_at = NULL, updated_at = now(), last_message_at = now(), unread_count = c.unread_count + 1,
		approval_id = NULL
	FROM reply WHERE c.id = reply.conversation_id
	RETURNING 1),
ops AS (
	UPDATE operations p SET message_id = reply.id, ` + notSentSQL + `
	FROM reply JOIN req ON req.run_id = reply.run_id
	WHERE p.message_id IS NULL AND (p.run_id = reply.run_id OR p.run_id IN (` + stoppedRunsSQL + `)
		OR (p.conversation_id = req.conversation_id AND p.turn_id = req.turn_id))
	RETURNING reply.run_id),
run AS (
	UPDATE agent_runs a SET status = 'finalized', reply_message_id = reply.id, finished_at = clock_timestamp()
	FROM reply WHERE a.id = reply.run_id
	RETURNING 1)
SELECT r.ord, owner.id IS NOT NULL, EXISTS (SELECT 1 FROM conversations x WHERE x.id = r.conversation_id AND x.run_id = r.run_id),
	coalesce(held.all_held, false), coalesce(newer.found, false), reply.id IS NOT NULL,
	(SELECT count(*) FROM ops WHERE ops.run_id = r.run_id), coalesce(reply.stopped, false), coalesce(reply.requeued, false), r.message_id
FROM req r
LEFT JOIN owner ON owner.id = r.conversation_id AND owner.run_id = r.run_id
LEFT JOIN held ON held.run_id = r.run_id
LEFT JOIN newer ON newer.run_id = r.run_id
LEFT JOIN reply ON reply.run_id = r.run_id
ORDER BY r.ord`

// finalizeNoWaitSQL is finalizeSQL that skips the conversations whose row
// another transaction holds instead of waiting for them: their rows show
// the run owning the conversation in the statement's snapshot but not
// locked.
var finalizeNoWaitSQL = noWait(finalizeSQL, "ORDER BY c.id FOR NO KEY UPDATE)")

// finalizeRow is one turn's row of finalizeSQL.
type finalizeRow struct {
	owned, ownedInSnapshot, allHeld, newer, replied, stopped, requeued bool
	operations                                                         int64
	// messageID is the reply's ID, derived from the turn.
	messageID string
}

// handBack reports whether the fence held but a newer message supersedes
// the turn: nothing was written, and SupersedeTx is to hand it back.
func (r finalizeRow) handBack() bool { return r.owned && r.allHeld && r.newer }

// finalized is what the finalize of f committed, by its row, or why it
// committed nothing; a row to hand back (handBack) is the caller's.
func (r finalizeRow) finalized(ctx context.Context, db Executor, f Finalize) (Finalized, error) {
	switch {
	case !r.owned:
		return Finalized{}, ownershipError(ctx, db, f.ConversationID)
	case !r.allHeld:
		return Finalized{}, fmt.Errorf("%w: some claimed rows are no longer processing for run %s", ErrLeaseLost, f.RunID)
	case !r.replied:
		// Only a finalize of the same turn can have written this reply's
		// ID, and that one released the rows: this run lost them.
		return Finalized{}, fmt.Errorf("%w: turn %s already has its reply", ErrLeaseLost, f.TurnID)
	}
	return Finalized{MessageID: r.messageID, Operations: r.operations, Stopped: r.stopped, Interrupted: r.requeued}, nil
}

// finalizeScan runs finalizeSQL (finalizeNoWaitSQL with skipLocked) for
// the turns fs, returning their rows in that order.
func finalizeScan(ctx context.Context, db Executor, fs []Finalize, skipLocked bool) ([]finalizeRow, error) {
	n := len(fs)
	convs, runs, turnIDs, contents, reasoning := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	generations := make([]int32, n)
	truncated, supersede, stopped := make([]bool, n), make([]bool, n), make([]bool, n)
	var ids []int64
	var idRuns []string
	for i, f := range fs {
		convs[i], runs[i], generations[i], turnIDs[i], contents[i], reasoning[i] = f.ConversationID, f.RunID, int32(f.Generation), f.TurnID, f.Content, f.Reasoning
		truncated[i], supersede[i], stopped[i] = f.Truncated, f.SupersedeIfNewer, f.Stopped
		for _, id := range f.OutboxIDs {
			ids, idRuns = append(ids, id), append(idRuns, f.RunID)
		}
	}
	query := finalizeSQL
	if skipLocked {
		query = finalizeNoWaitSQL
	}
	rows, err := db.Query(ctx, query, convs, runs, generations, turnIDs, contents, truncated, supersede, ids, idRuns, stopped, reasoning)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]finalizeRow, n)
	for rows.Next() {
		var ord int64
		var r finalizeRow
		if err := rows.Scan(&ord, &r.owned, &r.ownedInSnapshot, &r.allHeld, &r.newer, &r.replied, &r.operations, &r.stopped, &r.requeued, &r.messageID); err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(n) {
			return nil, fmt.Errorf("row %d of %d requested", ord, n)
		}
		out[ord-1] = r
	}
	return out, rows.Err()
}

// FinalizeTx ends a turn in the caller's transaction, all or nothing: the
// assistant reply with its reasoning (ID derived from the turn, so a
// redelivered trigger can never add a second one), the run's operations attached to it by run ID,
// the claimed rows done, the conversation's ordering and unread metadata,
// the lease released and the run recorded as finalized. A run that was
// asked to stop (StopTx) ends stopped (Finalized.Stopped); one that a
// newer message interrupted gives its rows back (Finalized.Interrupted).
// With
// SupersedeIfNewer and a newer message pending, the turn is handed back
// instead (SupersedeTx, Finalized.Superseded).
//
// It is one statement, finalizeSQL, the one FinalizeTurns sends for many;
// handing a turn back is a step of its own. It commits only while the run
// still owns the conversation (fencing): otherwise ErrLeaseLost, and
// nothing was written. A conversation deleted mid-turn is
// ErrConversationDeleted, which is a cancellation.
func FinalizeTx(ctx context.Context, tx Executor, f Finalize) (Finalized, error) {
	rows, err := finalizeScan(ctx, tx, []Finalize{f}, false)
	if err != nil {
		return Finalized{}, fmt.Errorf("finalize: %w", err)
	}
	r := rows[0]
	if !r.handBack() {
		return r.finalized(ctx, tx, f)
	}
	superseded, err := SupersedeTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, true)
	switch {
	case errors.Is(err, ErrStopRequested):
		// Asked to stop since the statement looked: it ends stopped,
		// with its reply.
		f.Stopped = true
	case err != nil:
		return Finalized{}, err
	case superseded:
		return Finalized{Superseded: true}, nil
	}
	f.SupersedeIfNewer = false
	return FinalizeTx(ctx, tx, f)
}

// wroteSQL is true when the run r.run_id, or its turn r.turn_id in
// r.conversation_id in any run, started a write: such a turn may have had
// a side effect, so it is never handed back to be answered again, by a
// newer message (superseding) or by an interrupt.
const wroteSQL = `EXISTS (SELECT 1 FROM operations p WHERE p.effect = 'write'
	AND (p.run_id = r.run_id OR (p.conversation_id = r.conversation_id AND p.turn_id = r.turn_id)))`

// stoppedRunsSQL selects the runs of the turn req.turn_id in
// req.conversation_id that stopped for an approval: the turn's reply
// carries their operations too.
const stoppedRunsSQL = `SELECT a.run_id FROM approvals a WHERE a.conversation_id = req.conversation_id AND a.turn_id = req.turn_id`

// notSentSQL settles, as the reply takes them, the calls of the turn that
// still wait for approval: the turn ended without sending them (it was
// stopped before the approved call left), and nothing sends them later.
const notSentSQL = `status = CASE WHEN p.status = 'awaiting_approval' THEN 'denied' ELSE p.status END,
	error = CASE WHEN p.status = 'awaiting_approval' THEN 'not sent: its turn ended first' ELSE p.error END,
	finished_at = CASE WHEN p.status = 'awaiting_approval' THEN now() ELSE p.finished_at END`

// releaseTx releases a run's conversation and moves its claimed rows to
// status, fenced by the run ID: when the conversation is no longer owned by
// runID, or any row is no longer processing for it, nothing must commit.
// With touch, the conversation's ordering and unread metadata count a new
// visible message.
func releaseTx(ctx context.Context, tx Executor, conversationID, runID string, outboxIDs []int64, status string, touch bool) error {
	q := `UPDATE conversations SET run_id = NULL, lease_expires_at = NULL`
	if status == "done" || status == "error" {
		// The turn ended: a later claim starts a new one, whatever
		// approval this one resumed from.
		q += `, approval_id = NULL`
	}
	if touch {
		q += `, updated_at = now(), last_message_at = now(), unread_count = unread_count + 1`
	}
	tag, err := tx.Exec(ctx, q+` WHERE id = $1 AND run_id = $2`, conversationID, runID)
	if err != nil {
		return fmt.Errorf("release conversation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ownershipError(ctx, tx, conversationID)
	}
	processedAt := "NULL"
	if status == "done" || status == "error" {
		processedAt = "now()"
	}
	tag, err = tx.Exec(ctx, `
		UPDATE agent_outbox SET status = $3, processed_at = `+processedAt+`
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, outboxIDs, runID, status)
	if err != nil {
		return fmt.Errorf("mark rows %s: %w", status, err)
	}
	if tag.RowsAffected() != int64(len(outboxIDs)) {
		return fmt.Errorf("%w: %d of %d claimed rows are still processing for run %s", ErrLeaseLost, tag.RowsAffected(), len(outboxIDs), runID)
	}
	return nil
}

// Failure is a failed attempt at a turn.
type Failure struct {
	ConversationID string
	RunID          string
	TurnID         string
	OutboxIDs      []int64
	// Reason is the operator's account of the failure: recorded on the
	// run, and as the error message's detail when the turn gives up. It
	// may name settings and servers, so the user never sees it.
	Reason string
	// UserText, when set, is a short explanation for the user of why the
	// turn failed (it must name no setting, server or secret). Defaults to
	// none: the user reads that the assistant could not answer.
	UserText string
	// MaxAttempts caps automatic attempts.
	MaxAttempts int
	// Terminal gives up at once, whatever the attempts: a side effect has
	// happened and repeating the turn could repeat it.
	Terminal bool
	// NotBefore, when positive, is how long the next attempt must wait
	// (the model server's Retry-After): under the cap the rows go back to
	// pending and the conversation may not be claimed before then.
	NotBefore time.Duration
}

// FailOutcome says what FailAttemptTx committed.
type FailOutcome struct {
	// GaveUp is true when the rows became error and a visible error message
	// was written (ErrorMessageID); false when they went back to pending.
	GaveUp         bool
	ErrorMessageID string
	// RetryIDs are rows back in pending, which the caller announces again
	// in the same transaction.
	RetryIDs []int64
	Attempts int
	// NotBefore is when the next attempt may start, when the failure
	// asked to wait; zero otherwise.
	NotBefore time.Time
}

// FailAttemptTx records a failed attempt in the caller's transaction, fenced
// like FinalizeTx. Under the attempt cap the rows go back to pending for the
// caller to announce again; at the cap (or when Terminal) a visible error
// message joins the conversation, the run's operations are attached to it,
// and the rows become error. Nothing is deleted.
func FailAttemptTx(ctx context.Context, tx Executor, f Failure) (FailOutcome, error) {
	var out FailOutcome
	var writes []string
	if err := tx.QueryRow(ctx, `
		SELECT (SELECT COALESCE(max(attempts), 0) FROM agent_outbox WHERE id = ANY($1)),
			COALESCE((SELECT array_agg(o.tool ORDER BY o.id) FROM operations o WHERE o.run_id = $2 AND `+blockingWriteSQL+`), '{}')`,
		f.OutboxIDs, f.RunID).Scan(&out.Attempts, &writes); err != nil {
		return out, fmt.Errorf("fail attempt: read attempts: %w", err)
	}
	if !f.Terminal && len(writes) > 0 {
		// A write started in this attempt, and may have taken effect even
		// if it reported a failure: another attempt could repeat it.
		f.Terminal = true
		f.UserText = startedWriteText(writes[0])
		f.Reason = fmt.Sprintf("failed after starting the write %q, which was not repeated: %s", writes[0], f.Reason)
	}
	if !f.Terminal && out.Attempts < f.MaxAttempts {
		if err := releaseTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, "pending", false); err != nil {
			return out, err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE agent_runs SET status = 'failed', error = $2, finished_at = clock_timestamp() WHERE id = $1`,
			f.RunID, f.Reason); err != nil {
			return out, fmt.Errorf("fail attempt: record run: %w", err)
		}
		if f.NotBefore > 0 {
			if err := tx.QueryRow(ctx, `
				UPDATE conversations SET not_before = clock_timestamp() + make_interval(secs => $2)
				WHERE id = $1 RETURNING not_before`, f.ConversationID, f.NotBefore.Seconds()).Scan(&out.NotBefore); err != nil {
				return out, fmt.Errorf("fail attempt: record the wait: %w", err)
			}
		}
		out.RetryIDs = f.OutboxIDs
		return out, nil
	}
	out.GaveUp = true
	out.ErrorMessageID = ErrorMessageID(f.RunID)
	content := failureText(f, out.Attempts)
	if _, err := tx.Exec(ctx, `
		INSERT INTO messages (id, conversation_id, role, content, detail, run_id, turn_id)
		VALUES ($1, $2, 'error', $3, $4, $5, $6)`,
		out.ErrorMessageID, f.ConversationID, content, f.Reason, f.RunID, f.TurnID); err != nil {
		switch {
		case IsForeignKeyViolation(err):
			return out, ErrConversationDeleted
		case IsUniqueViolation(err):
			return out, fmt.Errorf("%w: run %s already has its error", ErrLeaseLost, f.RunID)
		}
		return out, fmt.Errorf("fail attempt: insert error message: %w", err)
	}
	if err := releaseTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, "error", true); err != nil {
		return out, err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE operations SET message_id = $1
		WHERE message_id IS NULL AND (run_id = $2 OR (conversation_id = $3 AND turn_id = $4))`,
		out.ErrorMessageID, f.RunID, f.ConversationID, f.TurnID); err != nil {
		return out, fmt.Errorf("fail attempt: attach operations: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE agent_runs SET status = 'failed', error = $2, reply_message_id = $3, finished_at = clock_timestamp() WHERE id = $1`,
		f.RunID, f.Reason, out.ErrorMessageID); err != nil {
		return out, fmt.Errorf("fail attempt: record run: %w", err)
	}
	return out, nil
}

// startedWriteText tells the user that an action may have happened and was
// not repeated.
func startedWriteText(tool string) string {
	return fmt.Sprintf("The assistant stopped after starting the action %q, which may have taken effect; it was not repeated. Check its result, then press Retry or send your message again if needed.", tool)
}

// failureText is what the user reads about a turn that gave up: short,
// with the run as a reference an operator can look up (the run's error,
// the error message's detail, the logs), and nothing of the cause that
// could name a setting, a server or a secret.
func failureText(f Failure, attempts int) string {
	text := f.UserText
	switch {
	case text != "":
	case f.Terminal:
		text = "The assistant could not answer this message. Press Retry or send your message again."
	default:
		text = fmt.Sprintf("The assistant could not answer after %d attempts. Press Retry or send your message again.", attempts)
	}
	return text + " (Reference: " + f.RunID + ")"
}
