package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimSQL is the whole of the claims of conversations found free, in one
// statement (one round trip, its own transaction), for any number of
// conversations: lock them (in the order of their IDs, as every statement
// that locks several conversations does, so that two never wait for each
// other), take each one's oldest pending rows (at most its max_rows, or all
// when that is negative), mark them processing, take the lease, record the
// run, and read each turn's messages and the history before it. It returns
// one row per requested conversation, in the order asked (ord).
// Data-modifying CTEs see the statement's snapshot, in which the claimed
// rows are still pending: the history, which keeps only rows done or
// failed, leaves them out as it must. When a conversation is held or
// waits, nothing is written for it and its row says why.
//
// The snapshot predates the wait for the conversations' locks: a run may
// have claimed and finished rows in between, which the snapshot still
// shows pending. The UPDATE checks the status again on the row it changes
// (a changed row is re-read under READ COMMITTED), so a row another run
// took is never taken twice; the turn CTE alone would not see that.
const claimSQL = `
WITH req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::text[], $7::integer[]) WITH ORDINALITY
		AS r(conversation_id, run_id, lease_secs, max_rows, worker, session, ord)),
conv AS (
	SELECT c.id, c.run_id, c.lease_expires_at,
		coalesce(c.lease_expires_at <= now(), false) OR (c.run_id IS NOT NULL AND baton_run_session_gone(c.run_id)) AS expired,
		c.not_before, coalesce(c.not_before > now(), false) AS waiting, c.approval_id IS NOT NULL AS parked
	FROM conversations c WHERE c.id = ANY($1) ORDER BY c.id FOR UPDATE),
free AS (
	SELECT r.conversation_id, r.run_id, r.max_rows FROM req r JOIN conv ON conv.id = r.conversation_id
	WHERE conv.run_id IS NULL AND NOT conv.waiting AND NOT conv.parked),
turn AS (
	SELECT f.conversation_id, f.run_id, f.max_rows, t.id, t.rn FROM free f CROSS JOIN LATERAL (
		SELECT o.id, row_number() OVER (ORDER BY o.id) AS rn FROM agent_outbox o
		WHERE o.conversation_id = f.conversation_id AND o.status = 'pending'
		ORDER BY o.id
		LIMIT CASE WHEN f.max_rows < 0 THEN NULL ELSE f.max_rows + 1 END) t),
claimed AS (
	UPDATE agent_outbox o SET status = 'processing', attempts = o.attempts + 1, run_id = t.run_id
	FROM turn t WHERE o.id = t.id AND (t.max_rows < 0 OR t.rn <= t.max_rows) AND o.status = 'pending'
	RETURNING o.id, o.conversation_id, o.attempts, o.created_at, o.message_id, o.trace_parent, o.generation),
agg AS (
	SELECT conversation_id, array_agg(id ORDER BY id) AS ids,
		array_agg(coalesce(trace_parent, '') ORDER BY id) AS trace_parents,
		'turn_' || left(encode(sha256(convert_to(string_agg(id::text, ',' ORDER BY id)
			|| CASE WHEN max(generation) > 0 THEN '#' || max(generation) ELSE '' END, 'UTF8')), 'hex'), 32) AS turn_id,
		max(attempts) AS attempts, max(generation) AS generation, min(created_at) AS first_created_at
	FROM claimed GROUP BY conversation_id),
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
	RETURNING conversation_id, lease_expires_at)
SELECT r.ord, conv.id IS NOT NULL, EXISTS (SELECT 1 FROM conversations x WHERE x.id = r.conversation_id), conv.run_id, conv.lease_expires_at, coalesce(conv.expired, false),
	conv.not_before, coalesce(conv.waiting, false), coalesce(conv.parked, false),
	agg.ids, agg.trace_parents, agg.turn_id, agg.attempts, agg.generation, agg.first_created_at, run.lease_expires_at,
	(SELECT count(*) FROM turn WHERE turn.conversation_id = r.conversation_id),
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

// claimNoWaitSQL is claimSQL that skips the conversations whose row
// another transaction holds instead of waiting for them: their rows show
// the conversation in the statement's snapshot but not locked.
var claimNoWaitSQL = noWait(claimSQL, "ORDER BY c.id FOR UPDATE)")

// noWait is query with its lock clause lock made to skip locked rows.
func noWait(query, lock string) string {
	if strings.Count(query, lock) != 1 {
		panic("schema: the lock clause of a batched statement is not where it was")
	}
	return strings.Replace(query, lock, strings.TrimSuffix(lock, ")")+" SKIP LOCKED)", 1)
}

// ClaimResult is the outcome of one claim of ClaimTurns: ClaimTurn's
// results.
type ClaimResult struct {
	Claim Claim
	Input TurnInput
	Err   error
}

// ClaimTurn claims a conversation's pending rows for one run and loads the
// turn: the messages of exactly the claimed rows and up to historyLimit
// earlier ones. It is ClaimTx followed by LoadTurn with what they share
// folded into one statement, so a free conversation costs one round trip;
// only a conversation whose owner's lease expired takes ClaimTx's path, in
// a transaction, to recover that run first. Its errors are ClaimTx's.
func ClaimTurn(ctx context.Context, db Beginner, p ClaimParams, historyLimit int) (Claim, TurnInput, error) {
	r := ClaimTurns(ctx, db, []ClaimParams{p}, historyLimit)[0]
	return r.Claim, r.Input, r.Err
}

// ClaimTurnWithin is ClaimTurn that waits at most wait for each lock it
// needs (the server's lock_timeout, in a transaction of its own): past
// that it returns ErrLockWait, the server has claimed nothing, and the
// connection stays usable. (A context's deadline would close the
// connection, and stop the server's wait only through a cancel request sent
// on another connection, at best.)
func ClaimTurnWithin(ctx context.Context, db Beginner, p ClaimParams, historyLimit int, wait time.Duration) (Claim, TurnInput, error) {
	var c Claim
	var in TurnInput
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := setLockTimeout(ctx, tx, wait); err != nil {
			return err
		}
		var err error
		c, in, err = ClaimTurn(ctx, tx, p, historyLimit)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgLockNotAvailable {
		return Claim{}, TurnInput{}, ErrLockWait
	}
	if err != nil {
		return Claim{}, TurnInput{}, err
	}
	return c, in, nil
}

// ClaimTurns is ClaimTurn for several conversations in one statement: one
// round trip and one transaction for all of them, each claimed or refused
// on its own exactly as ClaimTurn would. Its result i is claim i's. When
// the server refuses the statement as a whole (a deadlock, or an input it
// cannot take), each conversation is claimed again alone, so that one
// conversation's trouble never holds up another's; an error of the
// connection is every claim's.
func ClaimTurns(ctx context.Context, db Beginner, ps []ClaimParams, historyLimit int) []ClaimResult {
	return claimTurns(ctx, db, ps, historyLimit, false)
}

// ClaimTurnsNoWait is ClaimTurns that never waits for a conversation: one
// that another transaction holds, or whose expired run must be recovered
// first, gets ErrRunAlone and nothing is written for it, so that one
// conversation never holds up the claims of others. A caller claims each
// of those again with ClaimTurn, on its own.
func ClaimTurnsNoWait(ctx context.Context, db Beginner, ps []ClaimParams, historyLimit int) []ClaimResult {
	return claimTurns(ctx, db, ps, historyLimit, true)
}

func claimTurns(ctx context.Context, db Beginner, ps []ClaimParams, historyLimit int, skipLocked bool) []ClaimResult {
	out := make([]ClaimResult, len(ps))
	seen := make(map[string]bool, len(ps))
	todo := make([]int, 0, len(ps))
	for i, p := range ps {
		switch {
		case p.Lease <= 0:
			out[i].Err = errors.New("claim: lease must be positive")
		case seen[p.ConversationID]:
			out[i].Err = fmt.Errorf("claim: conversation %s is asked for twice in one batch", p.ConversationID)
		default:
			seen[p.ConversationID] = true
			todo = append(todo, i)
		}
	}
	rows, err := claimScan(ctx, db, ps, todo, historyLimit, skipLocked)
	var pgErr *pgconn.PgError
	if err != nil && len(todo) > 1 && errors.As(err, &pgErr) && ctx.Err() == nil {
		for _, i := range todo {
			out[i] = claimTurns(ctx, db, ps[i:i+1], historyLimit, skipLocked)[0]
		}
		return out
	}
	if err != nil {
		for _, i := range todo {
			out[i].Err = fmt.Errorf("claim: %w", err)
		}
		return out
	}
	// Visibility: the statement's snapshot predates its wait for the
	// conversations' locks. A producer holds that lock until its commit
	// is visible, and logical decoding can hand the relay that commit
	// before then: this statement may have waited for exactly the commit
	// whose trigger it serves, and not seen its row. A second statement's
	// snapshot is newer than that wait, so it sees every commit that held
	// the lock.
	var again []int
	for k, i := range todo {
		if r := rows[k]; r.exists && r.owner == nil && !r.waiting && !r.parked && len(r.ids) == 0 {
			again = append(again, i)
			continue
		}
		out[i] = rows[k].result(ctx, db, ps[i], historyLimit, skipLocked)
	}
	if len(again) == 0 {
		return out
	}
	rows, err = claimScan(ctx, db, ps, again, historyLimit, skipLocked)
	for k, i := range again {
		if err != nil {
			out[i].Err = fmt.Errorf("claim: %w", err)
			continue
		}
		out[i] = rows[k].result(ctx, db, ps[i], historyLimit, skipLocked)
	}
	return out
}

// claimRow is one conversation's row of claimSQL.
type claimRow struct {
	exists, inSnapshot       bool
	owner                    *string
	expires, notBefore       *time.Time
	expired, waiting, parked bool
	ids                      []int64
	traceParents             []string
	turnID                   *string
	attempts, generation     *int
	firstCreated, leaseUntil *time.Time
	pending                  int64
	messages, history        []byte
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
		if err := rows.Scan(&ord, &r.exists, &r.inSnapshot, &r.owner, &r.expires, &r.expired, &r.notBefore, &r.waiting, &r.parked,
			&r.ids, &r.traceParents, &r.turnID, &r.attempts, &r.generation, &r.firstCreated, &r.leaseUntil,
			&r.pending, &r.messages, &r.history); err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(n) {
			return nil, fmt.Errorf("claim: row %d of %d requested", ord, n)
		}
		out[ord-1] = r
	}
	return out, rows.Err()
}

// result is what ClaimTurn (ClaimTurnsNoWait with skipLocked) returns for
// p, given its row.
func (r claimRow) result(ctx context.Context, db Beginner, p ClaimParams, historyLimit int, skipLocked bool) ClaimResult {
	fail := func(err error) ClaimResult { return ClaimResult{Err: err} }
	switch {
	case !r.exists && r.inSnapshot && skipLocked:
		// Held by another transaction, so skipped, or deleted since the
		// snapshot: the claim that waits tells which.
		return fail(ErrRunAlone)
	case !r.exists:
		return fail(ErrConversationDeleted)
	case r.owner != nil && r.expired && skipLocked:
		return fail(ErrRunAlone)
	case r.owner != nil && r.expired:
		// Recovering the run that held the conversation is a
		// transaction of several steps: ClaimTx's path.
		c, in, err := claimRecovering(ctx, db, p, historyLimit)
		return ClaimResult{Claim: c, Input: in, Err: err}
	case r.owner != nil:
		return fail(&BusyError{RunID: *r.owner, LeaseExpiresAt: *r.expires})
	case r.waiting:
		return fail(&WaitError{NotBefore: *r.notBefore})
	case r.parked && skipLocked:
		return fail(ErrRunAlone)
	case r.parked:
		// The turn stopped for an approval: ClaimTx's path resumes it, or
		// says that it still waits.
		c, in, err := claimRecovering(ctx, db, p, historyLimit)
		return ClaimResult{Claim: c, Input: in, Err: err}
	}
	c := Claim{RunID: p.RunID, ConversationID: p.ConversationID}
	if len(r.ids) == 0 {
		return ClaimResult{Claim: c}
	}
	c.OutboxIDs, c.TurnID, c.Attempts, c.Generation = r.ids, *r.turnID, *r.attempts, *r.generation
	for _, tp := range r.traceParents {
		if tp != "" {
			c.TraceParents = append(c.TraceParents, tp)
		}
	}
	c.FirstCreatedAt, c.LeaseExpiresAt = *r.firstCreated, *r.leaseUntil
	c.More = p.MaxRows > 0 && r.pending > int64(p.MaxRows)
	var in TurnInput
	if err := json.Unmarshal(r.messages, &in.Messages); err != nil {
		return ClaimResult{Claim: c, Input: in, Err: fmt.Errorf("claim: read the turn's messages: %w", err)}
	}
	if len(r.history) > 0 {
		if err := json.Unmarshal(r.history, &in.History); err != nil {
			return ClaimResult{Claim: c, Input: in, Err: fmt.Errorf("claim: read the history: %w", err)}
		}
	}
	if len(in.Messages) == 0 {
		// The conversation went between the claim and the read: it cannot
		// within one statement, but a turn without messages must never run.
		return ClaimResult{Claim: c, Input: in, Err: ErrConversationDeleted}
	}
	return ClaimResult{Claim: c, Input: in}
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
// transaction), for any number of turns: one row per turn, in the order
// asked (ord); the turns' outbox rows come flattened, each with its run.
// Every write of a turn is conditioned on its fence: the run still owns the
// conversation (the row lock, taken first and in the order of the
// conversations' IDs, orders it against a recovery, which changes
// ownership only under that lock) and every claimed row is still
// processing for it. Unless its fence holds, nothing is written for a turn,
// and its row says which part failed; the other turns commit regardless.
const finalizeSQL = `
WITH asked AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], $7::bool[], $10::bool[]) WITH ORDINALITY
		AS r(conversation_id, run_id, message_id, turn_id, content, truncated, supersede_if_newer, stopped, ord)),
ids AS (SELECT * FROM unnest($8::bigint[], $9::text[]) AS i(id, run_id)),
owner AS (
	SELECT c.id, c.run_id, c.stop_run_id FROM conversations c
	WHERE c.id = ANY($1) AND c.run_id = ANY($2) ORDER BY c.id FOR NO KEY UPDATE),
req AS (
	-- A run that was asked to stop (read from the locked row, as the stop
	-- left it) ends stopped, never superseded.
	SELECT r.conversation_id, r.run_id, r.message_id, r.turn_id, r.content, r.truncated, r.supersede_if_newer,
		r.stopped OR coalesce(o.stop_run_id = r.run_id, false) AS stopped, r.ord
	FROM asked r LEFT JOIN owner o ON o.id = r.conversation_id AND o.run_id = r.run_id),
held AS (
	SELECT i.run_id, bool_and(o.id IS NOT NULL) AS all_held FROM ids i
	LEFT JOIN agent_outbox o ON o.id = i.id AND o.run_id = i.run_id AND o.status = 'processing'
	GROUP BY i.run_id),
newer AS (
	SELECT r.run_id, r.supersede_if_newer AND NOT r.stopped
		AND EXISTS (SELECT 1 FROM agent_outbox o WHERE o.conversation_id = r.conversation_id AND o.status = 'pending')
		AND NOT EXISTS (SELECT 1 FROM operations p WHERE p.run_id = r.run_id AND p.effect = 'write') AS found
	FROM req r),
fence AS (
	SELECT r.* FROM req r
	JOIN owner ON owner.id = r.conversation_id AND owner.run_id = r.run_id
	JOIN held ON held.run_id = r.run_id
	JOIN newer ON newer.run_id = r.run_id
	WHERE held.all_held AND NOT newer.found),
reply AS (
	INSERT INTO messages (id, conversation_id, role, content, truncated, stopped, run_id, turn_id)
	SELECT message_id, conversation_id, 'assistant', content, truncated, stopped, run_id, turn_id FROM fence
	ON CONFLICT (id) DO NOTHING
	RETURNING id, conversation_id, run_id, stopped),
done AS (
	UPDATE agent_outbox o SET status = 'done', processed_at = now()
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
	WHERE p.message_id IS NULL AND (p.run_id = reply.run_id OR p.run_id IN (` + stoppedRunsSQL + `))
	RETURNING reply.run_id),
run AS (
	UPDATE agent_runs a SET status = 'finalized', reply_message_id = reply.id, finished_at = clock_timestamp()
	FROM reply WHERE a.id = reply.run_id
	RETURNING 1)
SELECT r.ord, owner.id IS NOT NULL, EXISTS (SELECT 1 FROM conversations x WHERE x.id = r.conversation_id AND x.run_id = r.run_id),
	coalesce(held.all_held, false), coalesce(newer.found, false), reply.id IS NOT NULL,
	(SELECT count(*) FROM ops WHERE ops.run_id = r.run_id), coalesce(reply.stopped, false)
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

// FinalizeResult is the outcome of one turn of FinalizeTurns: FinalizeTurn's
// results.
type FinalizeResult struct {
	Finalized Finalized
	Err       error
}

// FinalizeTurn is FinalizeTx in one statement: the reply, its operations,
// the rows done, the conversation's metadata and lease, and the run, all
// or nothing, fenced by the run's ownership. With SupersedeIfNewer and a
// newer message pending (and no write started), nothing is written and
// the turn is handed back instead (SupersedeTx, in a transaction of its
// own). Its errors are FinalizeTx's.
func FinalizeTurn(ctx context.Context, db Beginner, f Finalize) (Finalized, error) {
	r := FinalizeTurns(ctx, db, []Finalize{f})[0]
	return r.Finalized, r.Err
}

// FinalizeTurns is FinalizeTurn for several turns in one statement: one
// round trip and one transaction for all of them, each turn committed or
// refused on its own fence exactly as FinalizeTurn would (all or nothing
// per turn). Its result i is turn i's. When the server refuses the
// statement as a whole (a deadlock, or a reply it cannot store), each turn
// is finalized again alone, so that one turn's trouble never fails
// another; an error of the connection is every turn's.
func FinalizeTurns(ctx context.Context, db Beginner, fs []Finalize) []FinalizeResult {
	return finalizeTurns(ctx, db, fs, false)
}

// FinalizeTurnsNoWait is FinalizeTurns that never waits for a
// conversation: a turn whose conversation another transaction holds, or
// that a newer message supersedes (handing it back is a transaction of its
// own), gets ErrRunAlone and nothing is written for it, so that one
// conversation never holds up the finalizes of others. A caller finalizes
// each of those again with FinalizeTurn, on its own.
func FinalizeTurnsNoWait(ctx context.Context, db Beginner, fs []Finalize) []FinalizeResult {
	return finalizeTurns(ctx, db, fs, true)
}

func finalizeTurns(ctx context.Context, db Beginner, fs []Finalize, skipLocked bool) []FinalizeResult {
	out := make([]FinalizeResult, len(fs))
	n := len(fs)
	convs, runs, msgIDs, turnIDs, contents := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	truncated, supersede, stopped := make([]bool, n), make([]bool, n), make([]bool, n)
	var ids []int64
	var idRuns []string
	seen := make(map[string]bool, n)
	for i, f := range fs {
		run := f.RunID
		if seen[run] {
			// Sent without a run, it matches nothing and writes nothing.
			out[i].Err = fmt.Errorf("finalize: run %s is asked for twice in one batch", run)
			run = ""
		}
		seen[f.RunID] = true
		convs[i], runs[i], msgIDs[i], turnIDs[i], contents[i] = f.ConversationID, run, ReplyID(f.OutboxIDs, f.Generation), f.TurnID, f.Content
		truncated[i], supersede[i], stopped[i] = f.Truncated, f.SupersedeIfNewer, f.Stopped
		for _, id := range f.OutboxIDs {
			ids, idRuns = append(ids, id), append(idRuns, run)
		}
	}
	query := finalizeSQL
	if skipLocked {
		query = finalizeNoWaitSQL
	}
	rows, err := db.Query(ctx, query, convs, runs, msgIDs, turnIDs, contents, truncated, supersede, ids, idRuns, stopped)
	type row struct {
		owned, ownedInSnapshot, allHeld, newer, replied, stopped bool
		operations                                               int64
	}
	got := make([]row, n)
	if err == nil {
		for rows.Next() {
			var ord int64
			var r row
			if err = rows.Scan(&ord, &r.owned, &r.ownedInSnapshot, &r.allHeld, &r.newer, &r.replied, &r.operations, &r.stopped); err != nil {
				break
			}
			if ord < 1 || ord > int64(n) {
				err = fmt.Errorf("row %d of %d requested", ord, n)
				break
			}
			got[ord-1] = r
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	var pgErr *pgconn.PgError
	if err != nil && n > 1 && errors.As(err, &pgErr) && ctx.Err() == nil {
		for i := range fs {
			if out[i].Err == nil {
				out[i] = finalizeTurns(ctx, db, fs[i:i+1], skipLocked)[0]
			}
		}
		return out
	}
	for i, f := range fs {
		if out[i].Err != nil {
			continue
		}
		if err != nil {
			out[i].Err = fmt.Errorf("finalize: %w", err)
			continue
		}
		r := got[i]
		switch {
		case !r.owned && r.ownedInSnapshot && skipLocked:
			// Held by another transaction, so skipped, or taken from
			// the run since the snapshot: the finalize that waits tells
			// which.
			out[i].Err = ErrRunAlone
		case !r.owned:
			out[i].Err = ownershipError(ctx, db, f.ConversationID)
		case !r.allHeld:
			out[i].Err = fmt.Errorf("%w: some claimed rows are no longer processing for run %s", ErrLeaseLost, f.RunID)
		case r.newer && skipLocked:
			out[i].Err = ErrRunAlone
		case r.newer:
			out[i] = supersedeOrFinalize(ctx, db, f)
		case !r.replied:
			// Only a finalize of the same turn can have written this
			// reply's ID, and that one released the rows: this run lost
			// them.
			out[i].Err = fmt.Errorf("%w: turn %s already has its reply", ErrLeaseLost, f.TurnID)
		default:
			out[i].Finalized = Finalized{MessageID: ReplyID(f.OutboxIDs, f.Generation), Operations: r.operations, Stopped: r.stopped}
		}
	}
	return out
}

// supersedeOrFinalize hands back a turn that a newer message supersedes
// (SupersedeTx, in a transaction of its own), or finalizes it after all
// when the newer message went, or a write started, since the finalize
// statement looked.
func supersedeOrFinalize(ctx context.Context, db Beginner, f Finalize) FinalizeResult {
	var superseded bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		superseded, err = SupersedeTx(ctx, tx, f.ConversationID, f.RunID, f.OutboxIDs, true)
		return err
	})
	switch {
	case errors.Is(err, ErrStopRequested):
		// Asked to stop since the finalize statement looked: it ends
		// stopped, with its reply.
		f.Stopped = true
	case err != nil:
		return FinalizeResult{Err: err}
	case superseded:
		return FinalizeResult{Finalized: Finalized{Superseded: true}}
	}
	f.SupersedeIfNewer = false
	return FinalizeTurns(ctx, db, []Finalize{f})[0]
}
