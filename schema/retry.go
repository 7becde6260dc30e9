package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrQuota is what every QuotaError wraps.
var ErrQuota = errors.New("quota used up")

// QuotaError says that a user's quota is used up and when it frees up.
type QuotaError struct {
	// What is used up, for people: "retries of this conversation".
	What  string
	Limit int
	// Per is the quota's window; zero for a quota that frees up only when
	// something is deleted.
	Per time.Duration
	// RetryAfter is how long until the next use is allowed; zero when it
	// is not a matter of time.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	if e.Per > 0 {
		return fmt.Sprintf("%s are limited to %d per %s", e.What, e.Limit, e.Per)
	}
	return fmt.Sprintf("%s are limited to %d", e.What, e.Limit)
}

func (e *QuotaError) Unwrap() error { return ErrQuota }

// retryWindow is the period over which a conversation's retries count.
const retryWindow = time.Hour

// RetryResult says what RetryFailedTx did.
type RetryResult struct {
	// ConversationKey is the server's key of the conversation.
	ConversationKey string
	// OutboxIDs are the rows back in pending, for the caller to announce.
	OutboxIDs []int64
}

// Retry says whose conversation's failed turn is retried, and how.
type Retry struct {
	OwnerID        int64
	ConversationID string
	// MaxPerHour limits the conversation's retries in any hour; < 1 means
	// no limit.
	MaxPerHour int
	// RepeatWrites retries a turn that made writes, which the new attempt
	// may make again. Defaults to false: such a turn is refused with a
	// *WritesError.
	RepeatWrites bool
}

// RetryFailedTx puts the failed outbox rows of the owner's conversation back
// to pending with a fresh attempt budget, at the user's request, in a new
// retry epoch: the turn's steps start over, and an agent gets step
// identities it has not seen (see consumer.StepKey). The
// visible error messages stay: nothing about the failure is deleted. The
// caller announces the rows in the same transaction (AnnounceTx).
//
// A retry gives the model a new round of attempts, so a conversation's
// retries are limited to maxPerHour in any hour: past it, a *QuotaError
// says when the next one is allowed. A retry with nothing to retry does
// not count. A turn that made writes is a *WritesError unless
// RepeatWrites says to run it again all the same.
func RetryFailedTx(ctx context.Context, tx Executor, p Retry) (RetryResult, error) {
	ownerID, conversationID, maxPerHour := p.OwnerID, p.ConversationID, p.MaxPerHour
	var res RetryResult
	var windowStart *time.Time
	var used int
	var now time.Time
	err := tx.QueryRow(ctx, `
		SELECT id, retry_window_started_at, retries_in_window, now() FROM conversations
		WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`, ownerID, conversationID).Scan(&res.ConversationKey, &windowStart, &used, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, ErrNotFound
	}
	if err != nil {
		return res, fmt.Errorf("retry failed rows: %w", err)
	}
	if windowStart == nil || now.Sub(*windowStart) >= retryWindow {
		windowStart, used = &now, 0
	}
	if maxPerHour > 0 && used >= maxPerHour {
		return res, &QuotaError{What: "retries of a conversation", Limit: maxPerHour, Per: retryWindow,
			RetryAfter: windowStart.Add(retryWindow).Sub(now)}
	}
	var failed []int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM agent_outbox WHERE conversation_id = $1 AND status = 'error'`,
		res.ConversationKey).Scan(&failed); err != nil {
		return res, fmt.Errorf("retry failed rows: %w", err)
	}
	if err := checkRepeatTx(ctx, tx, res.ConversationKey, failed, p.RepeatWrites); err != nil {
		return res, err
	}
	rows, err := tx.Query(ctx, `
		UPDATE agent_outbox
		SET status = 'pending', attempts = 0, processed_at = NULL, run_id = NULL, announced_at = now(), epoch = epoch + 1, steps_turn_id = NULL
		WHERE conversation_id = $1 AND status = 'error'
		RETURNING id`, res.ConversationKey)
	if err != nil {
		return res, fmt.Errorf("retry failed rows: %w", err)
	}
	res.OutboxIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(res.OutboxIDs) == 0 {
		return res, err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations SET retry_window_started_at = $2, retries_in_window = $3 WHERE id = $1`,
		res.ConversationKey, *windowStart, used+1); err != nil {
		return res, fmt.Errorf("count retry: %w", err)
	}
	return res, nil
}

// CheckConversationQuotaTx locks ownerID's user row, so that concurrent
// creations of one user wait on each other, and returns a *QuotaError when
// the user already has max conversations. max < 1 means no limit. The
// caller creates the conversation in the same transaction.
func CheckConversationQuotaTx(ctx context.Context, tx Executor, ownerID int64, max int) error {
	if max < 1 {
		return nil
	}
	var n int
	err := tx.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM conversations WHERE owner_id = u.id) FROM users u WHERE u.id = $1 FOR UPDATE`, ownerID).Scan(&n)
	if err != nil {
		return fmt.Errorf("count conversations: %w", err)
	}
	if n >= max {
		return &QuotaError{What: "conversations of a user", Limit: max}
	}
	return nil
}
