package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A consumer group records every event it applies in its inbox
// (group_inbox), keyed by the event's ID, in the transaction of the event's
// effects: a redelivery or a replay of an applied event finds its key taken
// and applies nothing. An event that failed for good is parked in
// group_dead_letters, never dropped silently.

// RecordGroupEventTx records an event in the group's inbox and reports
// whether it was new, without naming the event's stream: the row counts
// as one of the relay's outbox stream when the pruner compares it with a
// stream (see StreamFloor). RecordInboxTx names the stream.
func RecordGroupEventTx(ctx context.Context, tx Executor, group, eventID string, streamSeq uint64, outboxID int64) (bool, error) {
	return RecordInboxTx(ctx, tx, InboxRow{Group: group, EventID: eventID, StreamSeq: streamSeq, OutboxID: outboxID})
}

// InboxRow is an event a group applied: its id, and where it was in which
// stream when it was applied.
type InboxRow struct {
	Group     string
	EventID   string
	Stream    string
	StreamSeq uint64
	OutboxID  int64
}

// RecordInboxTx records an event in the group's inbox and reports whether
// it was new. A second delivery of the same event that runs at the same
// time waits on the key and finds it taken once the first commits.
func RecordInboxTx(ctx context.Context, tx Executor, r InboxRow) (bool, error) {
	var stream *string
	if r.Stream != "" {
		stream = &r.Stream
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO group_inbox (group_name, event_id, stream, stream_seq, outbox_id)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (group_name, event_id) DO NOTHING`,
		r.Group, r.EventID, stream, int64(r.StreamSeq), r.OutboxID)
	if err != nil {
		return false, fmt.Errorf("record event in inbox: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ResolveDeadLetterTx marks a parked event resolved as applied, in the
// transaction that applied it (a replay or a retry after a fix).
func ResolveDeadLetterTx(ctx context.Context, tx Executor, group, eventID string) error {
	if _, err := tx.Exec(ctx, `
		UPDATE group_dead_letters SET resolved_at = now(), resolution = 'applied', retry_requested_at = NULL, retry_requested_by = NULL
		WHERE group_name = $1 AND event_id = $2 AND resolved_at IS NULL`, group, eventID); err != nil {
		return fmt.Errorf("resolve dead letter: %w", err)
	}
	return nil
}

// Resolutions of a dead letter.
const (
	// ResolutionApplied: a replay or a retry applied the event.
	ResolutionApplied = "applied"
	// ResolutionDiscarded: an operator gave the event up.
	ResolutionDiscarded = "discarded"
)

// ErrResolved: the dead letter was resolved already.
var ErrResolved = errors.New("dead letter already resolved")

// DiscardDeadLetterTx gives a parked event up at an operator's request: the
// dead letter stays, resolved as discarded, and the event is recorded in
// the group's inbox, so that no redelivery or replay applies it later. A
// dead letter that is not the group's is ErrNotFound; one resolved already
// is ErrResolved.
func DiscardDeadLetterTx(ctx context.Context, tx Executor, group string, id int64) (DeadLetter, error) {
	d, err := DeadLetterByID(ctx, tx, group, id, true)
	if err != nil {
		return d, err
	}
	if d.ResolvedAt != nil {
		return d, fmt.Errorf("%w: dead letter %d of group %s was %s at %s", ErrResolved, id, group, d.Resolution, d.ResolvedAt.Format(time.RFC3339))
	}
	var outboxID int64
	if d.OutboxID != nil {
		outboxID = *d.OutboxID
	}
	if _, err := RecordInboxTx(ctx, tx, InboxRow{Group: group, EventID: d.EventID, Stream: d.Stream, StreamSeq: d.StreamSeq, OutboxID: outboxID}); err != nil {
		return d, err
	}
	if err := tx.QueryRow(ctx, `
		UPDATE group_dead_letters SET resolved_at = now(), resolution = 'discarded', retry_requested_at = NULL, retry_requested_by = NULL
		WHERE id = $1 RETURNING resolved_at, resolution`, id).Scan(&d.ResolvedAt, &d.Resolution); err != nil {
		return d, fmt.Errorf("discard dead letter %d: %w", id, err)
	}
	return d, nil
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
	// Resolution is how it was resolved: ResolutionApplied or
	// ResolutionDiscarded; empty while it is not, and for events resolved
	// before resolutions were recorded.
	Resolution string
	// PublishedAt is when the stream stored the event; nil for events
	// parked before it was recorded.
	PublishedAt *time.Time
	// RetryRequestedAt is when an operator marked it for retry in the
	// console, and RetryRequestedBy who; the group's process applies the
	// retry and clears the mark. Nil when not marked.
	RetryRequestedAt *time.Time
	RetryRequestedBy string
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
		INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, outbox_id, headers, payload, attempts, error, published_at)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
		WHERE NOT EXISTS (SELECT 1 FROM group_inbox WHERE group_name = $1 AND event_id = $2)
		ON CONFLICT (group_name, event_id) DO UPDATE
		SET stream = excluded.stream, stream_seq = excluded.stream_seq, attempts = excluded.attempts,
		    error = excluded.error, parked = group_dead_letters.parked + 1,
		    parked_at = now(), resolved_at = NULL, resolution = NULL, retry_requested_at = NULL, retry_requested_by = NULL,
		    published_at = coalesce(excluded.published_at, group_dead_letters.published_at)`,
		d.Group, d.EventID, d.Stream, int64(d.StreamSeq), d.Subject, d.OutboxID, headers, d.Payload, d.Attempts, d.Error, d.PublishedAt)
	if err != nil {
		return fmt.Errorf("park event %s of group %s: %w", d.EventID, d.Group, err)
	}
	return nil
}

// DeadLetters lists a group's parked events, oldest first; unresolved only
// unless all is set.
func DeadLetters(ctx context.Context, db Executor, group string, all bool) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `
		SELECT `+deadLetterColumns+`
		FROM group_dead_letters
		WHERE group_name = $1 AND ($2 OR resolved_at IS NULL)
		ORDER BY parked_at, id`, group, all)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of group %s: %w", group, err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// CountDeadLetters counts a group's unresolved dead letters.
func CountDeadLetters(ctx context.Context, db Executor, group string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM group_dead_letters WHERE group_name = $1 AND resolved_at IS NULL`, group).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead letters of group %s: %w", group, err)
	}
	return n, nil
}

// DeadLetterByID returns one of a group's dead letters; forUpdate locks it
// for the caller's transaction. One that is not the group's is
// ErrNotFound.
func DeadLetterByID(ctx context.Context, db Executor, group string, id int64, forUpdate bool) (DeadLetter, error) {
	q := `SELECT ` + deadLetterColumns + ` FROM group_dead_letters WHERE group_name = $1 AND id = $2`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	d, err := scanDeadLetter(db.QueryRow(ctx, q, group, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("%w: group %s has no dead letter %d (`baton group dead-letters list %s --all` lists them)", ErrNotFound, group, id, group)
	}
	if err != nil {
		return d, fmt.Errorf("read dead letter %d of group %s: %w", id, group, err)
	}
	return d, nil
}

const deadLetterColumns = `id, group_name, event_id, stream, stream_seq, subject, outbox_id, headers, payload, attempts, error,
	parked, parked_at, resolved_at, coalesce(resolution, CASE WHEN resolved_at IS NOT NULL THEN 'applied' ELSE '' END), published_at,
	retry_requested_at, coalesce(retry_requested_by, '')`

func scanDeadLetter(row pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	var seq int64
	err := row.Scan(&d.ID, &d.Group, &d.EventID, &d.Stream, &seq, &d.Subject, &d.OutboxID, &d.Headers, &d.Payload,
		&d.Attempts, &d.Error, &d.Parked, &d.ParkedAt, &d.ResolvedAt, &d.Resolution, &d.PublishedAt,
		&d.RetryRequestedAt, &d.RetryRequestedBy)
	d.StreamSeq = uint64(seq)
	return d, err
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

// RequestDeadLetterRetryTx marks a parked event for retry at an
// operator's request (the console). Nothing is applied here: the group's
// own process, which has the handler, finds the mark (DeadLettersToRetry),
// retries the event and clears it. One that is not the group's is
// ErrNotFound; one resolved already ErrResolved.
func RequestDeadLetterRetryTx(ctx context.Context, tx Executor, group string, id int64, operator string) (DeadLetter, error) {
	d, err := DeadLetterByID(ctx, tx, group, id, true)
	if err != nil {
		return d, err
	}
	if d.ResolvedAt != nil {
		return d, fmt.Errorf("%w: dead letter %d of group %s was %s at %s", ErrResolved, id, group, d.Resolution, d.ResolvedAt.Format(time.RFC3339))
	}
	if err := tx.QueryRow(ctx, `
		UPDATE group_dead_letters SET retry_requested_at = now(), retry_requested_by = $2
		WHERE id = $1 RETURNING retry_requested_at, retry_requested_by`, id, operator).Scan(&d.RetryRequestedAt, &d.RetryRequestedBy); err != nil {
		return d, fmt.Errorf("mark dead letter %d for retry: %w", id, err)
	}
	return d, nil
}

// DeadLettersToRetry returns the ids of up to limit of a group's
// unresolved dead letters that an operator marked for retry, oldest mark
// first.
func DeadLettersToRetry(ctx context.Context, db Executor, group string, limit int) ([]int64, error) {
	rows, err := db.Query(ctx, `
		SELECT id FROM group_dead_letters
		WHERE group_name = $1 AND retry_requested_at IS NOT NULL AND resolved_at IS NULL
		ORDER BY id LIMIT $2`, group, limit)
	if err != nil {
		return nil, fmt.Errorf("list the dead letters of group %s marked for retry: %w", group, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// ClearDeadLetterRetry takes the retry mark off a dead letter whose retry
// could not run (it was resolved meanwhile, or cannot be decoded), so
// that the group does not try it again and again.
func ClearDeadLetterRetry(ctx context.Context, db Executor, group string, id int64) error {
	if _, err := db.Exec(ctx, `
		UPDATE group_dead_letters SET retry_requested_at = NULL, retry_requested_by = NULL
		WHERE group_name = $1 AND id = $2`, group, id); err != nil {
		return fmt.Errorf("clear the retry mark of dead letter %d of group %s: %w", id, group, err)
	}
	return nil
}

// DeadLetterGroup is one group's unresolved dead letters, counted.
type DeadLetterGroup struct {
	Group        string
	Open         int64
	OldestParked time.Time
}

// DeadLetterGroups counts the unresolved dead letters of each group that
// has any, through the partial index of unresolved ones.
func DeadLetterGroups(ctx context.Context, db Executor) ([]DeadLetterGroup, error) {
	rows, err := db.Query(ctx, `
		SELECT group_name, count(*), min(parked_at) FROM group_dead_letters
		WHERE resolved_at IS NULL GROUP BY group_name ORDER BY group_name`)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetterGroup, error) {
		var g DeadLetterGroup
		err := row.Scan(&g.Group, &g.Open, &g.OldestParked)
		return g, err
	})
}

// DeadLetterPage lists a group's unresolved dead letters, oldest first:
// up to limit with an id above after.
func DeadLetterPage(ctx context.Context, db Executor, group string, after int64, limit int) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `
		SELECT `+deadLetterColumns+` FROM group_dead_letters
		WHERE group_name = $1 AND resolved_at IS NULL AND id > $2
		ORDER BY id LIMIT $3`, group, after, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead letters of group %s: %w", group, err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}
