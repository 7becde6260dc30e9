package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/batonhq/baton/schema"
)

// DeadLetter is an event a group gave up on: parked with its last error,
// never dropped silently. A replay that covers it delivers it again, and
// applying it then marks it resolved.
type DeadLetter struct {
	ID        int64
	Group     string
	EventID   string
	Stream    string
	StreamSeq uint64
	Subject   string
	OutboxID  *int64
	Payload   []byte
	// Attempts is how many deliveries failed before it was parked.
	Attempts int
	Error    string
	// Parked counts how often the event was parked (again after replays).
	Parked     int
	ParkedAt   time.Time
	ResolvedAt *time.Time
}

// park records ev in group_dead_letters with the error that ended it,
// unless the group applied it meanwhile (another process, after an ack wait
// expired).
func park(ctx context.Context, db schema.Executor, ev Event, cause error) error {
	headers, err := json.Marshal(ev.Header)
	if err != nil {
		return err
	}
	if headers == nil || string(headers) == "null" {
		headers = []byte("{}")
	}
	var outboxID *int64
	if ev.OutboxID > 0 {
		outboxID = &ev.OutboxID
	}
	_, err = db.Exec(ctx, `
		INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, outbox_id, headers, payload, attempts, error)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
		WHERE NOT EXISTS (SELECT 1 FROM group_inbox WHERE group_name = $1 AND event_id = $2)
		ON CONFLICT (group_name, event_id) DO UPDATE
		SET stream = excluded.stream, stream_seq = excluded.stream_seq, attempts = excluded.attempts,
		    error = excluded.error, parked = group_dead_letters.parked + 1,
		    parked_at = now(), resolved_at = NULL`,
		ev.Group, ev.ID, ev.Stream, int64(ev.StreamSeq), ev.Subject, outboxID, headers, ev.Data, ev.Attempt, cause.Error())
	if err != nil {
		return fmt.Errorf("park event %s of group %s: %w", ev.ID, ev.Group, err)
	}
	return nil
}

// DeadLetters lists a group's parked events, oldest first; unresolved only
// unless all is set.
func DeadLetters(ctx context.Context, db schema.Executor, group string, all bool) ([]DeadLetter, error) {
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
