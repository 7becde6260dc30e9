package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner runs queries and starts transactions: *pgxpool.Pool and
// *pgx.Conn qualify.
type Beginner interface {
	Executor
	Begin(ctx context.Context) (pgx.Tx, error)
}

// claimSQL is the whole of a claim that finds its conversation free, in one
// statement (one round trip, its own transaction): lock the conversation,
// take the oldest pending rows (at most $4, or all when $4 < 0), mark them
// processing, take the lease, record the run, and read the turn's messages
// and the history before it. Data-modifying CTEs see the statement's
// snapshot, in which the claimed rows are still pending: the history,
// which keeps only rows done or failed, leaves them out as it must. When
// the conversation is held or waits, nothing is written and the row says
// why.
//
// The snapshot predates the wait for the conversation's lock: a run may
// have claimed and finished rows in between, which the snapshot still
// shows pending. The UPDATE checks the status again on the row it changes
// (a changed row is re-read under READ COMMITTED), so a row another run
// took is never taken twice; the turn CTE alone would not see that.
const claimSQL = `
WITH conv AS (
	SELECT run_id, lease_expires_at, coalesce(lease_expires_at <= now(), false) AS expired,
		not_before, coalesce(not_before > now(), false) AS waiting
	FROM conversations WHERE id = $1 FOR UPDATE),
free AS (SELECT 1 FROM conv WHERE run_id IS NULL AND NOT waiting),
turn AS (
	SELECT id FROM agent_outbox
	WHERE conversation_id = $1 AND status = 'pending' AND EXISTS (SELECT 1 FROM free)
	ORDER BY id
	LIMIT CASE WHEN $4::bigint < 0 THEN NULL ELSE $4::bigint + 1 END),
picked AS (SELECT id FROM turn ORDER BY id LIMIT CASE WHEN $4::bigint < 0 THEN NULL ELSE $4::bigint END),
claimed AS (
	UPDATE agent_outbox o SET status = 'processing', attempts = attempts + 1, run_id = $2
	FROM picked WHERE o.id = picked.id AND o.status = 'pending'
	RETURNING o.id, o.attempts, o.created_at, o.message_id, o.trace_parent),
agg AS (
	SELECT array_agg(id ORDER BY id) AS ids,
		array_agg(coalesce(trace_parent, '') ORDER BY id) AS trace_parents,
		'turn_' || left(encode(sha256(convert_to(string_agg(id::text, ',' ORDER BY id), 'UTF8')), 'hex'), 32) AS turn_id,
		max(attempts) AS attempts, min(created_at) AS first_created_at
	FROM claimed HAVING count(*) > 0),
lease AS (
	UPDATE conversations
	SET run_id = $2, lease_expires_at = clock_timestamp() + make_interval(secs => $3), not_before = NULL
	WHERE id = $1 AND EXISTS (SELECT 1 FROM agg)
	RETURNING lease_expires_at),
run AS (
	INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, started_at, lease_expires_at)
	SELECT $2, $1, agg.turn_id, agg.ids, $5, clock_timestamp(), lease.lease_expires_at FROM agg, lease
	RETURNING lease_expires_at)
SELECT conv.run_id, conv.lease_expires_at, conv.expired, conv.not_before, conv.waiting,
	agg.ids, agg.trace_parents, agg.turn_id, agg.attempts, agg.first_created_at, (SELECT lease_expires_at FROM run),
	(SELECT count(*) FROM turn),
	(SELECT json_agg(json_build_object('id', m.id, 'conversation_id', m.conversation_id, 'role', m.role,
		'content', m.content, 'created_at', m.created_at, 'seq', m.seq) ORDER BY m.seq)
	 FROM messages m JOIN claimed c ON c.message_id = m.id),
	(SELECT json_agg(h ORDER BY h.seq) FROM (
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND (o.id IS NULL OR o.status IN ('done', 'error')) AND EXISTS (SELECT 1 FROM agg)
		ORDER BY m.seq DESC LIMIT $6) h)
FROM conv LEFT JOIN agg ON true`

// ClaimTurn claims a conversation's pending rows for one run and loads the
// turn: the messages of exactly the claimed rows and up to historyLimit
// earlier ones. It is ClaimTx followed by LoadTurn with what they share
// folded into one statement, so a free conversation costs one round trip;
// only a conversation whose owner's lease expired takes ClaimTx's path, in
// a transaction, to recover that run first. Its errors are ClaimTx's.
func ClaimTurn(ctx context.Context, db Beginner, p ClaimParams, historyLimit int) (Claim, TurnInput, error) {
	if p.Lease <= 0 {
		return Claim{}, TurnInput{}, errors.New("claim: lease must be positive")
	}
	limit := int64(p.MaxRows)
	if limit <= 0 {
		limit = -1
	}
	var (
		owner                    *string
		expires, notBefore       *time.Time
		expired, waiting         bool
		ids                      []int64
		traceParents             []string
		turnID                   *string
		attempts                 *int
		firstCreated, leaseUntil *time.Time
		pending                  int64
		messages, history        []byte
	)
	scan := func() error {
		return db.QueryRow(ctx, claimSQL, p.ConversationID, p.RunID, p.Lease.Seconds(), limit, p.Worker, max(historyLimit, 0)).Scan(
			&owner, &expires, &expired, &notBefore, &waiting, &ids, &traceParents, &turnID, &attempts, &firstCreated, &leaseUntil,
			&pending, &messages, &history)
	}
	err := scan()
	if err == nil && owner == nil && !waiting && len(ids) == 0 {
		// Visibility: the statement's snapshot predates its wait for the
		// conversation's lock. A producer holds that lock until its commit
		// is visible, and logical decoding can hand the relay that commit
		// before then: this statement may have waited for exactly the
		// commit whose trigger it serves, and not seen its row. A second
		// statement's snapshot is newer than that wait, so it sees every
		// commit that held the lock.
		err = scan()
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Claim{}, TurnInput{}, ErrConversationDeleted
	case err != nil:
		return Claim{}, TurnInput{}, fmt.Errorf("claim: %w", err)
	case owner != nil && expired:
		// Recovering the run that held the conversation is a
		// transaction of several steps: ClaimTx's path.
		return claimRecovering(ctx, db, p, historyLimit)
	case owner != nil:
		return Claim{}, TurnInput{}, &BusyError{RunID: *owner, LeaseExpiresAt: *expires}
	case waiting:
		return Claim{}, TurnInput{}, &WaitError{NotBefore: *notBefore}
	}
	c := Claim{RunID: p.RunID, ConversationID: p.ConversationID}
	if len(ids) == 0 {
		return c, TurnInput{}, nil
	}
	c.OutboxIDs, c.TurnID, c.Attempts = ids, *turnID, *attempts
	for _, tp := range traceParents {
		if tp != "" {
			c.TraceParents = append(c.TraceParents, tp)
		}
	}
	c.FirstCreatedAt, c.LeaseExpiresAt = *firstCreated, *leaseUntil
	c.More = limit >= 0 && pending > limit
	var in TurnInput
	if err := json.Unmarshal(messages, &in.Messages); err != nil {
		return c, in, fmt.Errorf("claim: read the turn's messages: %w", err)
	}
	if len(history) > 0 {
		if err := json.Unmarshal(history, &in.History); err != nil {
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

// claimRecovering is ClaimTurn's path for a conversation whose owner's
// lease expired: ClaimTx (which recovers that run inline) and LoadTurn in
// one transaction.
func claimRecovering(ctx context.Context, db Beginner, p ClaimParams, historyLimit int) (Claim, TurnInput, error) {
	var c Claim
	var in TurnInput
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if c, err = ClaimTx(ctx, tx, p); err != nil || c.Empty() {
			return err
		}
		in, err = LoadTurn(ctx, tx, p.ConversationID, c.OutboxIDs, historyLimit)
		return err
	})
	return c, in, err
}

// finalizeSQL is FinalizeTx in one statement (one round trip, its own
// transaction). Every write is conditioned on the fence: the run still
// owns the conversation (the row lock, taken first, orders it against a
// recovery, which changes ownership only under that lock) and every
// claimed row is still processing for it. Unless the fence holds, nothing
// is written, and the row says which part failed.
const finalizeSQL = `
WITH owner AS (
	SELECT id FROM conversations WHERE id = $1 AND run_id = $2 FOR NO KEY UPDATE),
held AS (
	SELECT count(*) = cardinality($3::bigint[]) AS all_held FROM agent_outbox
	WHERE id = ANY($3) AND run_id = $2 AND status = 'processing'),
newer AS (
	SELECT $8::bool
		AND EXISTS (SELECT 1 FROM agent_outbox WHERE conversation_id = $1 AND status = 'pending')
		AND NOT EXISTS (SELECT 1 FROM operations WHERE run_id = $2 AND effect = 'write') AS found),
fence AS (SELECT 1 FROM owner, held, newer WHERE held.all_held AND NOT newer.found),
reply AS (
	INSERT INTO messages (id, conversation_id, role, content, truncated, run_id, turn_id)
	SELECT $4, $1, 'assistant', $5, $6, $2, $7 FROM fence
	ON CONFLICT (id) DO NOTHING
	RETURNING id),
done AS (
	UPDATE agent_outbox SET status = 'done', processed_at = now()
	WHERE id = ANY($3) AND run_id = $2 AND status = 'processing' AND EXISTS (SELECT 1 FROM reply)
	RETURNING 1),
conv AS (
	UPDATE conversations
	SET run_id = NULL, lease_expires_at = NULL, updated_at = now(), last_message_at = now(), unread_count = unread_count + 1
	WHERE id = $1 AND EXISTS (SELECT 1 FROM reply)
	RETURNING 1),
ops AS (
	UPDATE operations SET message_id = $4 WHERE run_id = $2 AND message_id IS NULL AND EXISTS (SELECT 1 FROM reply)
	RETURNING 1),
run AS (
	UPDATE agent_runs SET status = 'finalized', reply_message_id = $4, finished_at = clock_timestamp()
	WHERE id = $2 AND EXISTS (SELECT 1 FROM reply)
	RETURNING 1)
SELECT EXISTS (SELECT 1 FROM owner), (SELECT all_held FROM held), (SELECT found FROM newer),
	EXISTS (SELECT 1 FROM reply), (SELECT count(*) FROM ops)`

// FinalizeTurn is FinalizeTx in one statement: the reply, its operations,
// the rows done, the conversation's metadata and lease, and the run, all
// or nothing, fenced by the run's ownership. With SupersedeIfNewer and a
// newer message pending (and no write started), nothing is written and
// the turn is handed back instead (SupersedeTx, in a transaction of its
// own). Its errors are FinalizeTx's.
func FinalizeTurn(ctx context.Context, db Beginner, f Finalize) (Finalized, error) {
	out := Finalized{MessageID: ReplyMessageID(f.TurnID)}
	var owned, allHeld, newer, replied bool
	err := db.QueryRow(ctx, finalizeSQL, f.ConversationID, f.RunID, f.OutboxIDs, out.MessageID, f.Content, f.Truncated, f.TurnID, f.SupersedeIfNewer).
		Scan(&owned, &allHeld, &newer, &replied, &out.Operations)
	switch {
	case err != nil:
		return Finalized{}, fmt.Errorf("finalize: %w", err)
	case !owned:
		return Finalized{}, ownershipError(ctx, db, f.ConversationID)
	case !allHeld:
		return Finalized{}, fmt.Errorf("%w: some claimed rows are no longer processing for run %s", ErrLeaseLost, f.RunID)
	case newer:
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var err error
			out.Superseded, err = SupersedeTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, true)
			return err
		})
		if err != nil {
			return Finalized{}, err
		}
		if !out.Superseded {
			// The newer message went, or a write started, between the two
			// statements: finalize after all.
			f.SupersedeIfNewer = false
			return FinalizeTurn(ctx, db, f)
		}
		return Finalized{Superseded: true}, nil
	case !replied:
		// Only a finalize of the same turn can have written this reply's
		// ID, and that one released the rows: this run lost them.
		return Finalized{}, fmt.Errorf("%w: turn %s already has its reply", ErrLeaseLost, f.TurnID)
	}
	return out, nil
}
