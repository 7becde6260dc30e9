package schema

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
)

// Prefixes of the logical decoding messages that the relay reads from the
// slot beside the outbox inserts.
const (
	// AnnouncePrefix marks a transactional "announce these outbox rows
	// again" message, emitted by recovery, the sweeper and a user's retry
	// in the same transaction that changes the rows: no dual write.
	AnnouncePrefix = "baton.announce"
	// HeartbeatPrefix marks the relay's own non-transactional heartbeat,
	// which lets the slot advance while the outbox is idle and other tables
	// are busy.
	HeartbeatPrefix = "baton.heartbeat"
)

// Announcement is the payload of an AnnouncePrefix message.
type Announcement struct {
	Reason   batonnats.Reason    `json:"reason"`
	Triggers []batonnats.Trigger `json:"triggers"`
}

// ParseAnnouncement decodes an AnnouncePrefix payload.
func ParseAnnouncement(payload []byte) (Announcement, error) {
	var a Announcement
	if err := json.Unmarshal(payload, &a); err != nil {
		return Announcement{}, fmt.Errorf("announcement payload: %w", err)
	}
	return a, nil
}

// AnnounceTx announces the given outbox rows again, inside the caller's
// transaction: the relay publishes one trigger per row once (and only if)
// the transaction commits. Each announcement gets a label of its own for
// JetStream's duplicate window (the row's attempts for a retry, the time
// for a sweep or a user's retry), so a relay's republication never doubles
// an announcement and a new one is never swallowed.
//
// Visibility: the relay may publish an announcement before the transaction
// that made it is visible to other sessions (see ClaimTx). Each caller
// leaves the claim that the trigger causes nothing to miss:
//
//   - recovery and a failed attempt (RecoverExpiredTx, RecoverRunTx,
//     FailAttemptTx) lock the conversation row and release its lease in
//     the announcing transaction, and a user's retry (RetryFailedTx) locks
//     it FOR NO KEY UPDATE: the claim, which locks that row FOR UPDATE
//     first, waits until the announcement's commit is visible;
//   - the sweeper and a relay that recreated its slot (AnnounceStaleTx,
//     AnnouncePendingTx) announce rows that were pending in a commit they
//     could already see, so any later claim sees them pending too; the
//     announcing transaction only locks and stamps them, and a claim that
//     meets that lock waits for it and then takes the rows.
//
// A consumer group's handler gets the same early events but claims
// nothing: a handler that reads the rows an event names (the message, the
// outbox row) should first lock the conversation row FOR SHARE, which
// waits for the producer's FOR NO KEY UPDATE (InsertMessageTx), or treat a
// missing row as a retryable error. The built-in groups read only the
// event.
func AnnounceTx(ctx context.Context, tx Executor, reason batonnats.Reason, outboxIDs []int64) error {
	if len(outboxIDs) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `
		SELECT id, conversation_id, message_id, created_at, attempts
		FROM agent_outbox WHERE id = ANY($1) ORDER BY id`, outboxIDs)
	if err != nil {
		return fmt.Errorf("announce: load outbox rows: %w", err)
	}
	defer rows.Close()
	a := Announcement{Reason: reason}
	now := time.Now().UnixNano()
	for rows.Next() {
		var t batonnats.Trigger
		var attempts int
		if err := rows.Scan(&t.OutboxID, &t.ConversationID, &t.MessageID, &t.CreatedAt, &attempts); err != nil {
			return err
		}
		t.Reason = reason
		t.Announcement = announcementLabel(reason, attempts, now)
		a.Triggers = append(a.Triggers, t)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(a.Triggers) == 0 {
		return nil
	}
	payload, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, AnnouncePrefix, payload); err != nil {
		return fmt.Errorf("announce: emit logical message: %w", err)
	}
	return nil
}

// announcementLabel tells announcements of one row apart.
func announcementLabel(reason batonnats.Reason, attempts int, now int64) string {
	switch reason {
	case batonnats.ReasonRetry:
		return "a" + strconv.Itoa(attempts)
	case batonnats.ReasonSweep:
		return "s" + strconv.FormatInt(now, 10)
	case batonnats.ReasonUserRetry:
		return "u" + strconv.FormatInt(now, 10)
	}
	return ""
}

// AnnounceStaleTx marks up to limit pending rows that were neither claimed
// nor announced within age as announced now, announces them in tx, and
// returns their IDs. Rows of a conversation that waits for an approval are
// left until it is decided or expires: the sweep is what notices an
// approval past its time. SKIP LOCKED lets several relays sweep side by side;
// the partial index agent_outbox_sweep keeps it to the pending rows.
func AnnounceStaleTx(ctx context.Context, tx Executor, age time.Duration, limit int) ([]int64, error) {
	return announceMarked(ctx, tx, `
		WITH due AS (
			SELECT id FROM agent_outbox
			WHERE status = 'pending'
			  AND coalesce(announced_at, created_at) < now() - make_interval(secs => $1)
			  -- A conversation that waits for an approval has nothing to
			  -- claim until it is decided or its time is up; then the next
			  -- sweep announces it, and the claim expires it.
			  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.conversation_id = agent_outbox.conversation_id
				AND a.status = 'pending' AND a.expires_at > now())
			ORDER BY coalesce(announced_at, created_at)
			LIMIT $2
			FOR UPDATE SKIP LOCKED)
		UPDATE agent_outbox o SET announced_at = now()
		FROM due WHERE o.id = due.id
		RETURNING o.id`, age.Seconds(), limit)
}

// AnnouncePendingTx marks up to limit pending rows with IDs above afterID
// as announced now, in ID order, announces them in tx, and returns their
// IDs: a relay that created its slot calls it until it returns fewer than
// limit, to cover the rows committed before the slot existed.
func AnnouncePendingTx(ctx context.Context, tx Executor, afterID int64, limit int) ([]int64, error) {
	return announceMarked(ctx, tx, `
		WITH due AS (
			SELECT id FROM agent_outbox
			WHERE status = 'pending' AND id > $1
			ORDER BY id LIMIT $2
			FOR UPDATE SKIP LOCKED)
		UPDATE agent_outbox o SET announced_at = now()
		FROM due WHERE o.id = due.id
		RETURNING o.id`, afterID, limit)
}

// announceMarked runs a query that marks rows announced and returns their
// IDs, and announces them as a sweep in the same transaction: the
// announcement exists exactly when the mark does.
func announceMarked(ctx context.Context, tx Executor, query string, args ...any) ([]int64, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	if err := AnnounceTx(ctx, tx, batonnats.ReasonSweep, ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// EmitHeartbeat writes a non-transactional heartbeat message into the WAL.
func EmitHeartbeat(ctx context.Context, db Executor, at time.Time) error {
	_, err := db.Exec(ctx, `SELECT pg_logical_emit_message(false, $1::text, $2::text)`,
		HeartbeatPrefix, at.UTC().Format(time.RFC3339Nano))
	return err
}
