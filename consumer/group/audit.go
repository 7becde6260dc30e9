package group

import (
	"context"

	"github.com/batonhq/baton/schema"
	"github.com/jackc/pgx/v5"
)

// AuditGroup is the name of the built-in audit group.
const AuditGroup = "audit"

// Audit is the built-in audit group's handler: it appends each event to
// audit_events, an append-only table (a trigger refuses updates, deletes and
// truncation). With the group's inbox in the same transaction, every event
// is in the log exactly once, however often it is delivered or replayed.
func Audit(ctx context.Context, tx pgx.Tx, ev Event) error {
	return schema.AppendAuditTx(ctx, tx, schema.AuditEvent{
		Group: ev.Group, EventID: ev.ID, StreamSeq: ev.StreamSeq, Subject: ev.Subject, OutboxID: ev.OutboxID,
		ConversationID: ev.ConversationID, MessageID: ev.MessageID, Reason: string(ev.Reason),
		OutboxCreatedAt: ev.CreatedAt, PublishedAt: ev.PublishedAt,
	})
}
