package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Errors of RegenerateTx (and, for ErrTurnRunning, InsertMessageTx).
var (
	// ErrTurnRunning: a turn of the conversation runs or waits; nothing
	// can be regenerated until it ends, and a new message to a
	// conversation whose double texting is DoubleTextingReject is refused.
	ErrTurnRunning = errors.New("a turn of the conversation is running")
	// ErrNotNewest: what was asked to be regenerated is not the newest
	// turn of the conversation.
	ErrNotNewest = errors.New("only the newest reply can be regenerated")
)

// Regenerate says which turn is answered again and how.
type Regenerate struct {
	OwnerID        int64
	ConversationID string
	// MessageID is the owner's id of the user message whose turn is
	// answered again: the newest user message of the conversation.
	MessageID string
	// ReplyID, when set, is the reply the client means to replace; it
	// must be that turn's reply. Defaults to none: the turn's reply,
	// whichever it is.
	ReplyID string
	// MaxPerHour limits a conversation's retries and regenerations
	// together (each gives the model a new round); < 1 means no limit.
	MaxPerHour int
	// RepeatWrites answers again a turn that made writes, which the new
	// answer may make again. Defaults to false: such a turn is refused
	// with a *WritesError.
	RepeatWrites bool
}

// Regenerated says what RegenerateTx committed.
type Regenerated struct {
	ConversationKey string
	// OutboxIDs are the rows put back to pending, ascending, for the
	// caller to announce in the same transaction (AnnounceTx).
	OutboxIDs []int64
	// Generation is the rows' new generation: the new turn's reply is
	// derived from OutboxIDs and Generation (see TurnIDs).
	Generation int
	// Superseded is the reply (or visible error) that the new turn
	// replaces, kept and marked superseded; empty when the turn had none
	// (its messages were settled by a stop before a turn answered them).
	Superseded string
}

// RegenerateTx puts the newest turn of a conversation back to be answered
// again, in the caller's transaction: its outbox rows (those the run that
// answered MessageID answered, or that message's alone when no run did)
// go back to pending with one more generation and a fresh attempt budget,
// and its reply is marked superseded. The new turn has an identity of its
// own (TurnIDOf), so its reply gets a new id and the old one stays. The
// caller announces the rows (AnnounceTx).
//
// It refuses with ErrTurnRunning while a run holds the conversation or a
// message waits, with ErrNotNewest when the message or the reply is not
// the conversation's newest turn, with ErrNotFound for an unknown
// conversation or message, with a *WritesError when the turn made writes
// and RepeatWrites is not set, and with a *QuotaError past MaxPerHour.
func RegenerateTx(ctx context.Context, tx Executor, g Regenerate) (Regenerated, error) {
	var out Regenerated
	var runID *string
	var windowStart *time.Time
	var used int
	var now time.Time
	err := tx.QueryRow(ctx, `
		SELECT id, run_id, retry_window_started_at, retries_in_window, now() FROM conversations
		WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`, g.OwnerID, g.ConversationID).Scan(&out.ConversationKey, &runID, &windowStart, &used, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, ErrNotFound
	}
	if err != nil {
		return out, fmt.Errorf("regenerate: lock conversation: %w", err)
	}
	var waiting bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM agent_outbox WHERE conversation_id = $1 AND status IN ('pending', 'processing'))`,
		out.ConversationKey).Scan(&waiting); err != nil {
		return out, fmt.Errorf("regenerate: %w", err)
	}
	if runID != nil || waiting {
		return out, ErrTurnRunning
	}
	// The message's row, and the run that answered it.
	var rowID int64
	var answeredBy *string
	err = tx.QueryRow(ctx, `
		SELECT o.id, o.run_id FROM messages m JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.owner_id = $1 AND m.public_id = $2 AND m.conversation_id = $3 AND o.status IN ('done', 'error')`,
		g.OwnerID, g.MessageID, out.ConversationKey).Scan(&rowID, &answeredBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, fmt.Errorf("%w: message %q of conversation %q has no turn to answer again", ErrNotFound, g.MessageID, g.ConversationID)
	}
	if err != nil {
		return out, fmt.Errorf("regenerate: find the message's turn: %w", err)
	}
	out.OutboxIDs = []int64{rowID}
	if answeredBy != nil {
		rows, err := tx.Query(ctx, `
			SELECT id FROM agent_outbox WHERE conversation_id = $1 AND run_id = $2 AND status IN ('done', 'error') ORDER BY id`,
			out.ConversationKey, *answeredBy)
		if err != nil {
			return out, fmt.Errorf("regenerate: rows of the turn: %w", err)
		}
		if out.OutboxIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return out, fmt.Errorf("regenerate: rows of the turn: %w", err)
		}
		// The reply (or visible error) the turn ended with.
		err = tx.QueryRow(ctx, `
			SELECT id FROM messages WHERE conversation_id = $1 AND run_id = $2 AND role IN ('assistant', 'error') AND superseded_at IS NULL
			ORDER BY seq DESC LIMIT 1`, out.ConversationKey, *answeredBy).Scan(&out.Superseded)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return out, fmt.Errorf("regenerate: the turn's reply: %w", err)
		}
	}
	if g.ReplyID != "" && g.ReplyID != out.Superseded {
		return out, fmt.Errorf("%w: %q is not the reply to message %q", ErrNotNewest, g.ReplyID, g.MessageID)
	}
	if err := checkRepeatTx(ctx, tx, out.ConversationKey, out.OutboxIDs, g.RepeatWrites); err != nil {
		return out, err
	}
	// Nothing may follow the turn: no newer user message, no newer reply.
	var newer bool
	if err := tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM agent_outbox WHERE conversation_id = $1 AND id > $2)
			OR EXISTS (SELECT 1 FROM messages WHERE conversation_id = $1 AND role IN ('assistant', 'error') AND superseded_at IS NULL
				AND id <> $3 AND seq > (SELECT max(m.seq) FROM agent_outbox o JOIN messages m ON m.id = o.message_id WHERE o.id = ANY($4)))`,
		out.ConversationKey, out.OutboxIDs[len(out.OutboxIDs)-1], out.Superseded, out.OutboxIDs).Scan(&newer); err != nil {
		return out, fmt.Errorf("regenerate: %w", err)
	}
	if newer {
		return out, fmt.Errorf("%w: message %q was answered before newer messages", ErrNotNewest, g.MessageID)
	}
	if windowStart == nil || now.Sub(*windowStart) >= retryWindow {
		windowStart, used = &now, 0
	}
	if g.MaxPerHour > 0 && used >= g.MaxPerHour {
		return out, &QuotaError{What: "retries and regenerations of a conversation", Limit: g.MaxPerHour, Per: retryWindow,
			RetryAfter: windowStart.Add(retryWindow).Sub(now)}
	}
	if err := tx.QueryRow(ctx, `
		WITH back AS (
			UPDATE agent_outbox
			SET status = 'pending', attempts = 0, processed_at = NULL, run_id = NULL, stopped_at = NULL,
				announced_at = now(), generation = generation + 1, steps_turn_id = NULL
			WHERE id = ANY($1)
			RETURNING generation)
		SELECT max(generation) FROM back`, out.OutboxIDs).Scan(&out.Generation); err != nil {
		return out, fmt.Errorf("regenerate: rows back to pending: %w", err)
	}
	if out.Superseded != "" {
		if _, err := tx.Exec(ctx, `UPDATE messages SET superseded_at = now() WHERE id = $1`, out.Superseded); err != nil {
			return out, fmt.Errorf("regenerate: mark the reply superseded: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations SET retry_window_started_at = $2, retries_in_window = $3, not_before = NULL WHERE id = $1`,
		out.ConversationKey, *windowStart, used+1); err != nil {
		return out, fmt.Errorf("regenerate: count it: %w", err)
	}
	return out, nil
}
