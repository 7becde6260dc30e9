package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Prefixes of the logical decoding messages the relay understands.
const (
	// AnnouncePrefix marks a transactional "announce these outbox rows
	// again" message, emitted by recovery and the sweeper in the same
	// transaction that changes the rows: no dual write.
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

// AnnounceTx announces the given outbox rows again, inside the caller's
// transaction: the relay publishes one trigger per row once (and only if)
// the transaction commits. A retry is labelled with the row's attempts and a
// sweep with the time, so JetStream's duplicate window keeps a relay's
// republication from doubling an announcement but never swallows a new one.
func AnnounceTx(ctx context.Context, tx schema.Executor, reason batonnats.Reason, outboxIDs []int64) error {
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
		switch reason {
		case batonnats.ReasonRetry:
			t.Announcement = "a" + strconv.Itoa(attempts)
		case batonnats.ReasonSweep:
			t.Announcement = "s" + strconv.FormatInt(now, 10)
		}
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

// ParseAnnouncement decodes an AnnouncePrefix payload.
func ParseAnnouncement(payload []byte) (Announcement, error) {
	var a Announcement
	if err := json.Unmarshal(payload, &a); err != nil {
		return Announcement{}, fmt.Errorf("relay: announcement payload: %w", err)
	}
	return a, nil
}
