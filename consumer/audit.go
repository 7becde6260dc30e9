package consumer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AuditGroup is the name of the built-in audit group.
const AuditGroup = "audit"

// Audit is the built-in audit group's handler: it appends each event to
// audit_events, an append-only table (a trigger refuses updates, deletes and
// truncation). With the group's inbox in the same transaction, every event
// is in the log exactly once, however often it is delivered or replayed.
func Audit(ctx context.Context, tx pgx.Tx, ev Event) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO audit_events (group_name, event_id, stream_seq, subject, outbox_id, conversation_id, message_id, reason, outbox_created_at, published_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		ev.Group, ev.ID, int64(ev.StreamSeq), ev.Subject, ev.OutboxID, ev.ConversationID, ev.MessageID,
		string(ev.Reason), ev.CreatedAt, ev.PublishedAt)
	if err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}
