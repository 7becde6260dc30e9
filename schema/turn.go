package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A turn is what one run answers: the claimed rows' messages and the
// history before them (TurnInput, LoadTurn). Below them, the worker's
// forms of the claim and the finalize: each in a transaction of its own,
// many turns in one statement (claimSQL, finalizeSQL), the same statement
// that ClaimTx and FinalizeTx run in a caller's transaction.

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
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq,
			EXISTS (SELECT FROM message_files mf WHERE mf.message_id = m.id)
		FROM agent_outbox o JOIN messages m ON m.id = o.message_id
		WHERE o.id = ANY($1) AND o.conversation_id = $2
		ORDER BY m.seq`, outboxIDs, conversationID)
	if err != nil {
		return in, fmt.Errorf("load turn messages: %w", err)
	}
	in.Messages, err = scanMessages(ctx, db, rows)
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
		SELECT id, conversation_id, role, content, created_at, seq, has_files FROM (
			SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq,
				EXISTS (SELECT FROM message_files mf WHERE mf.message_id = m.id) AS has_files
			FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
			WHERE m.conversation_id = $1 AND (o.id IS NULL OR o.status IN ('done', 'error')) AND m.superseded_at IS NULL
			ORDER BY m.seq DESC LIMIT $2) h
		ORDER BY seq`, conversationID, historyLimit)
	if err != nil {
		return in, fmt.Errorf("load history: %w", err)
	}
	in.History, err = scanMessages(ctx, db, rows)
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
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq,
			EXISTS (SELECT FROM message_files mf WHERE mf.message_id = m.id)
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND m.seq < $2 AND (o.id IS NULL OR o.status IN ('done', 'error')) AND m.superseded_at IS NULL
		ORDER BY m.seq DESC LIMIT $3`, conversationID, beforeSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	return scanMessages(ctx, db, rows)
}

// scanMessages reads messages of a turn, whose ID is the server's key,
// and then their files, when one has any (a second query only then).
func scanMessages(ctx context.Context, db Executor, rows pgx.Rows) ([]Message, error) {
	defer rows.Close()
	var out []Message
	files := false
	for rows.Next() {
		var m Message
		var has bool
		if err := rows.Scan(&m.ID, &m.ConversationID, &m.Role, &m.Content, &m.CreatedAt, &m.Seq, &has); err != nil {
			return nil, err
		}
		m.Key = m.ID
		files = files || has
		out = append(out, m)
	}
	if err := rows.Err(); err != nil || !files {
		return out, err
	}
	return out, attachFiles(ctx, db, out)
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
// earlier ones. It is ClaimTx followed by LoadTurn in a transaction of its
// own, and a free conversation costs one statement; only a conversation
// whose owner may be taken over, or whose turn stopped at an approval,
// takes ClaimTx's steps, in a transaction. Its errors are ClaimTx's.
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
	// Visibility (see ClaimTx): this statement may have waited for exactly
	// the commit whose trigger it serves, and not seen its row. A second
	// statement's snapshot is newer than that wait, so it sees every
	// commit that held the lock.
	var again []int
	for k, i := range todo {
		if r := rows[k]; r.free() && len(r.ids) == 0 {
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

// result is what ClaimTurn (ClaimTurnsNoWait with skipLocked) returns for
// p, given its row.
func (r claimRow) result(ctx context.Context, db Beginner, p ClaimParams, historyLimit int, skipLocked bool) ClaimResult {
	switch {
	case !r.exists && r.inSnapshot && skipLocked:
		// Held by another transaction, so skipped, or deleted since the
		// snapshot: the claim that waits tells which.
		return ClaimResult{Err: ErrRunAlone}
	case (r.takeover() || r.parked()) && skipLocked:
		return ClaimResult{Err: ErrRunAlone}
	case r.takeover() || r.parked():
		// Recovering the run that held the conversation, or resuming the
		// turn that stopped at an approval, are steps of their own before
		// the claim: ClaimTx's, in a transaction.
		c, in, err := claimRecovering(ctx, db, p, historyLimit)
		return ClaimResult{Claim: c, Input: in, Err: err}
	}
	c, in, err := r.claim(p)
	return ClaimResult{Claim: c, Input: in, Err: err}
}

// claimRecovering is ClaimTurn's path for a conversation that needs
// ClaimTx's steps (recovering an expired or gone owner, resuming an
// approval): ClaimTx, loading the turn, in a transaction of its own.
func claimRecovering(ctx context.Context, db Beginner, p ClaimParams, historyLimit int) (Claim, TurnInput, error) {
	var c Claim
	var in TurnInput
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		c, in, err = claimTx(ctx, tx, p, historyLimit, true)
		return err
	})
	return c, in, err
}

// FinalizeResult is the outcome of one turn of FinalizeTurns: FinalizeTurn's
// results.
type FinalizeResult struct {
	Finalized Finalized
	Err       error
}

// FinalizeTurn is FinalizeTx in a transaction of its own, in one
// statement: the reply, its operations, the rows done, the conversation's
// metadata and lease, and the run, all or nothing, fenced by the run's
// ownership. With SupersedeIfNewer and a newer message pending (and no
// write started), nothing is written and the turn is handed back instead
// (FinalizeTx, in a transaction of its own). Its errors are FinalizeTx's.
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
	sent := make([]Finalize, len(fs))
	seen := make(map[string]bool, len(fs))
	for i, f := range fs {
		sent[i] = f
		if seen[f.RunID] {
			// Sent without a run, it matches nothing and writes nothing.
			out[i].Err = fmt.Errorf("finalize: run %s is asked for twice in one batch", f.RunID)
			sent[i].RunID = ""
		}
		seen[f.RunID] = true
	}
	rows, err := finalizeScan(ctx, db, sent, skipLocked)
	var pgErr *pgconn.PgError
	if err != nil && len(fs) > 1 && errors.As(err, &pgErr) && ctx.Err() == nil {
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
		r := rows[i]
		switch {
		case !r.owned && r.ownedInSnapshot && skipLocked:
			// Held by another transaction, so skipped, or taken from
			// the run since the snapshot: the finalize that waits tells
			// which.
			out[i].Err = ErrRunAlone
		case r.handBack() && skipLocked:
			out[i].Err = ErrRunAlone
		case r.handBack():
			out[i] = finalizeAlone(ctx, db, f)
		default:
			out[i].Finalized, out[i].Err = r.finalized(ctx, db, f)
		}
	}
	return out
}

// finalizeAlone is FinalizeTx in a transaction of its own: the path of a
// turn that a newer message supersedes, which SupersedeTx hands back in
// the finalize's transaction, or which is finalized after all when the
// newer message went, or a write started, since the batch looked.
func finalizeAlone(ctx context.Context, db Beginner, f Finalize) FinalizeResult {
	var out Finalized
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		out, err = FinalizeTx(ctx, tx, f)
		return err
	})
	if err != nil {
		return FinalizeResult{Err: err}
	}
	return FinalizeResult{Finalized: out}
}
