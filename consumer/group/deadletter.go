package group

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsclient "github.com/nats-io/nats.go"

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
	var published *time.Time
	if !ev.PublishedAt.IsZero() {
		published = &ev.PublishedAt
	}
	err = schema.Park(ctx, g.pool, schema.DeadLetter{
		Group: ev.Group, EventID: ev.ID, Stream: ev.Stream, StreamSeq: ev.StreamSeq, Subject: ev.Subject,
		OutboxID: outboxID, Headers: headers, Payload: ev.Data, Attempts: ev.Attempt, Error: cause.Error(),
		PublishedAt: published,
	})
	if err == nil {
		g.refreshDeadLetters(ctx)
	}
	return err
}

// RetryDeadLetter applies a parked event again with the group's handler,
// in this process, from what the dead letter kept (the event's headers and
// body), the way a delivery does: with its inbox row and the dead letter's
// resolution in one transaction. An event already applied meanwhile is
// OutcomeDuplicate; a failure parks it again with the new error (counted in
// DeadLetter.Parked) and is returned. A resolved dead letter is
// schema.ErrResolved. Nothing is published: the stream is the relay's, and
// other groups have their own copy of the event.
func (g *Group) RetryDeadLetter(ctx context.Context, id int64) (Outcome, error) {
	d, err := schema.DeadLetterByID(ctx, g.pool, g.cfg.Name, id, false)
	if err != nil {
		return "", err
	}
	if d.ResolvedAt != nil {
		return "", fmt.Errorf("%w: dead letter %d of group %s was %s at %s", schema.ErrResolved, id, d.Group, d.Resolution, d.ResolvedAt.Format(time.RFC3339))
	}
	ev := Event{
		ID: d.EventID, Group: d.Group, Stream: d.Stream, StreamSeq: d.StreamSeq, Subject: d.Subject,
		Header: natsclient.Header{}, Data: d.Payload, Attempt: d.Attempts + 1,
		// Events parked before their publication time was kept get the
		// time they were parked, the nearest known.
		PublishedAt: d.ParkedAt,
	}
	if d.PublishedAt != nil {
		ev.PublishedAt = *d.PublishedAt
	}
	if len(d.Headers) > 0 {
		if err := json.Unmarshal(d.Headers, &ev.Header); err != nil {
			return "", fmt.Errorf("dead letter %d of group %s: its headers do not decode: %w", id, d.Group, err)
		}
	}
	var outcome Outcome
	if terr := ev.readTrigger(); terr != nil {
		err = &handlerError{err: Permanent(fmt.Errorf("malformed event: %w", terr))}
	} else {
		outcome, err = g.apply(ctx, ev)
	}
	var he *handlerError
	if errors.As(err, &he) {
		if perr := g.park(ctx, ev, he.err); perr != nil {
			return "", fmt.Errorf("retry of dead letter %d failed (%v), and parking it again failed: %w", id, he.err, perr)
		}
		g.settled(ev, OutcomeParked)
		return OutcomeParked, fmt.Errorf("dead letter %d of group %s failed again and stays parked: %w", id, d.Group, he.err)
	}
	if err != nil {
		return "", fmt.Errorf("retry dead letter %d of group %s: %w", id, d.Group, err)
	}
	g.settled(ev, outcome)
	g.refreshDeadLetters(ctx)
	return outcome, nil
}

// applyRetryRequests retries, with this process's handler, the group's
// dead letters that an operator marked for retry (the console marks them
// and applies nothing: only the group has the handler), every
// RetryRequestInterval until ctx ends. A retry that fails parks the event
// again, which clears the mark; one that cannot run at all (the event was
// resolved meanwhile, its headers do not decode) clears it too, so that
// nothing is tried again and again. Several processes of the group may
// take the same mark: the inbox applies the event once.
func (g *Group) applyRetryRequests(ctx context.Context) {
	t := time.NewTicker(g.cfg.RetryRequestInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids, err := schema.DeadLettersToRetry(ctx, g.pool, g.cfg.Name, 100)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn().Err(err).Msg("cannot read the dead letters marked for retry; trying again later")
			}
			continue
		}
		for _, id := range ids {
			outcome, err := g.RetryDeadLetter(ctx, id)
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				g.log.Info().Int64("dead_letter", id).Str("outcome", string(outcome)).Msg("retried a dead letter an operator marked")
			case outcome == OutcomeParked:
				g.log.Warn().Err(err).Int64("dead_letter", id).Msg("a dead letter an operator marked for retry failed again and is parked")
			default:
				g.log.Warn().Err(err).Int64("dead_letter", id).Msg("cannot retry a dead letter an operator marked; its mark is cleared")
				if cerr := schema.ClearDeadLetterRetry(ctx, g.pool, g.cfg.Name, id); cerr != nil && ctx.Err() == nil {
					g.log.Warn().Err(cerr).Int64("dead_letter", id).Msg("cannot clear a dead letter's retry mark")
				}
			}
		}
	}
}

// DeadLetters lists a group's parked events, oldest first; unresolved only
// unless all is set.
func DeadLetters(ctx context.Context, db schema.Executor, group string, all bool) ([]DeadLetter, error) {
	return schema.DeadLetters(ctx, db, group, all)
}
