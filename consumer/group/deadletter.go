package group

import (
	"context"
	"encoding/json"

	"github.com/batonhq/baton/schema"
)

// DeadLetter is an event a group gave up on: parked with its last error,
// never dropped silently. A replay that covers it delivers it again, and
// applying it then marks it resolved.
type DeadLetter = schema.DeadLetter

// park records ev in group_dead_letters with the error that ended it,
// unless the group applied it meanwhile (another process, after an ack wait
// expired).
func (g *Group) park(ctx context.Context, ev Event, cause error) error {
	headers, err := json.Marshal(ev.Header)
	if err != nil {
		return err
	}
	var outboxID *int64
	if ev.OutboxID > 0 {
		outboxID = &ev.OutboxID
	}
	return schema.Park(ctx, g.cfg.Pool, schema.DeadLetter{
		Group: ev.Group, EventID: ev.ID, Stream: ev.Stream, StreamSeq: ev.StreamSeq, Subject: ev.Subject,
		OutboxID: outboxID, Headers: headers, Payload: ev.Data, Attempts: ev.Attempt, Error: cause.Error(),
	})
}

// DeadLetters lists a group's parked events, oldest first; unresolved only
// unless all is set.
func DeadLetters(ctx context.Context, db schema.Executor, group string, all bool) ([]DeadLetter, error) {
	return schema.DeadLetters(ctx, db, group, all)
}
