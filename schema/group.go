package schema

import (
	"context"
	"fmt"
	"time"
)

// A consumer group records every event it applies in its inbox
// (group_inbox), keyed by the event's ID, in the transaction of the event's
// effects: a redelivery or a replay of an applied event finds its key taken
// and applies nothing. An event that failed for good is parked in
// group_dead_letters, never dropped silently.

// RecordGroupEventTx records an event in the group's inbox and reports
// whether it was new. A second delivery of the same event that runs at the
// same time waits on the key and finds it taken once the first commits.
func RecordGroupEventTx(ctx context.Context, tx Executor, group, eventID string, streamSeq uint64, outboxID int64) (bool, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO group_inbox (group_name, event_id, stream_seq, outbox_id)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (group_name, event_id) DO NOTHING`,
		group, eventID, int64(streamSeq), outboxID)
	if err != nil {
		return false, fmt.Errorf("record event in inbox: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ResolveDeadLetterTx marks a parked event resolved, in the transaction
// that applied it (a replay after a fix).
func ResolveDeadLetterTx(ctx context.Context, tx Executor, group, eventID string) error {
	if _, err := tx.Exec(ctx, `
		UPDATE group_dead_letters SET resolved_at = now()
		WHERE group_name = $1 AND event_id = $2 AND resolved_at IS NULL`, group, eventID); err != nil {
		return fmt.Errorf("resolve dead letter: %w", err)
	}
	return nil
}

// GroupApplied reports whether group has applied the event with the given
// ID: whether its inbox holds it.
func GroupApplied(ctx context.Context, db Executor, group, eventID string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM group_inbox WHERE group_name = $1 AND event_id = $2)`, group, eventID).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("read inbox of group %s: %w", group, err)
	}
	return ok, nil
}

// CountGroupApplied counts the events between two stream sequences
// (inclusive) that the group's inbox holds.
func CountGroupApplied(ctx context.Context, db Executor, group string, fromSeq, toSeq uint64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `
		SELECT count(*) FROM group_inbox WHERE group_name = $1 AND stream_seq BETWEEN $2 AND $3`,
		group, int64(fromSeq), int64(toSeq)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count applied events of group %s: %w", group, err)
	}
	return n, nil
}

// DeadLetter is an event a group gave up on: parked with its last error.
// A replay that covers it delivers it again, and applying it then marks it
// resolved.
type DeadLetter struct {
	ID        int64
	Group     string
	EventID   string
	Stream    string
	StreamSeq uint64
	Subject   string
	OutboxID  *int64
	// Headers is the event's headers as a JSON object.
	Headers []byte
	Payload []byte
	// Attempts is how many deliveries failed before it was parked.
	Attempts int
	Error    string
	// Parked counts how often the event was parked (again after replays).
	Parked     int
	ParkedAt   time.Time
	ResolvedAt *time.Time
}

// Park records d in group_dead_letters with the error that ended it,
// unless the group applied it meanwhile (another process, after an ack wait
// expired). Parking an event again counts it and clears its resolution.
func Park(ctx context.Context, db Executor, d DeadLetter) error {
	headers := d.Headers
	if len(headers) == 0 || string(headers) == "null" {
		headers = []byte("{}")
	}
	_, err := db.Exec(ctx, `
		INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, outbox_id, headers, payload, attempts, error)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
		WHERE NOT EXISTS (SELECT 1 FROM group_inbox WHERE group_name = $1 AND event_id = $2)
		ON CONFLICT (group_name, event_id) DO UPDATE
		SET stream = excluded.stream, stream_seq = excluded.stream_seq, attempts = excluded.attempts,
		    error = excluded.error, parked = group_dead_letters.parked + 1,
		    parked_at = now(), resolved_at = NULL`,
		d.Group, d.EventID, d.Stream, int64(d.StreamSeq), d.Subject, d.OutboxID, headers, d.Payload, d.Attempts, d.Error)
	if err != nil {
		return fmt.Errorf("park event %s of group %s: %w", d.EventID, d.Group, err)
	}
	return nil
}

// DeadLetters lists a group's parked events, oldest first; unresolved only
// unless all is set.
func DeadLetters(ctx context.Context, db Executor, group string, all bool) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `
		SELECT id, group_name, event_id, stream, stream_seq, subject, outbox_id, payload, attempts, error, parked, parked_at, resolved_at
		FROM group_dead_letters
		WHERE group_name = $1 AND ($2 OR resolved_at IS NULL)
		ORDER BY parked_at, id`, group, all)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of group %s: %w", group, err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var d DeadLetter
		var seq int64
		if err := rows.Scan(&d.ID, &d.Group, &d.EventID, &d.Stream, &seq, &d.Subject, &d.OutboxID, &d.Payload,
			&d.Attempts, &d.Error, &d.Parked, &d.ParkedAt, &d.ResolvedAt); err != nil {
			return nil, err
		}
		d.StreamSeq = uint64(seq)
		out = append(out, d)
	}
	return out, rows.Err()
}

// AuditEvent is one row of audit_events, the append-only log that the
// built-in audit group keeps.
type AuditEvent struct {
	Group           string
	EventID         string
	StreamSeq       uint64
	Subject         string
	OutboxID        int64
	ConversationID  string
	MessageID       string
	Reason          string
	OutboxCreatedAt time.Time
	PublishedAt     time.Time
}

// AppendAuditTx appends e to audit_events, which refuses updates, deletes
// and truncation.
func AppendAuditTx(ctx context.Context, tx Executor, e AuditEvent) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO audit_events (group_name, event_id, stream_seq, subject, outbox_id, conversation_id, message_id, reason, outbox_created_at, published_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		e.Group, e.EventID, int64(e.StreamSeq), e.Subject, e.OutboxID, e.ConversationID, e.MessageID,
		e.Reason, e.OutboxCreatedAt, e.PublishedAt)
	if err != nil {
		return fmt.Errorf("append audit event: %w", err)
	}
	return nil
}
