package group

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/schema"
)

// handlerError is a failure of the group's handler, as opposed to one of
// the machinery around it: only these count towards parking an event.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// apply runs the handler for ev in one transaction with the event's inbox
// row. The inbox row goes first: a second delivery of the same event that
// runs at the same time (an ack wait that expired while the first was still
// running) waits on its key and finds it taken once the first commits.
func (g *Group) apply(ctx context.Context, ev Event) (Outcome, error) {
	outcome := OutcomeApplied
	err := pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
		fresh, err := schema.RecordInboxTx(ctx, tx, schema.InboxRow{
			Group: ev.Group, EventID: ev.ID, Stream: ev.Stream, StreamSeq: ev.StreamSeq, OutboxID: ev.OutboxID,
		})
		if err != nil {
			return err
		}
		if !fresh {
			outcome = OutcomeDuplicate
			return nil
		}
		if err := callHandler(ctx, g.cfg.Handler, tx, ev); err != nil {
			return &handlerError{err: err}
		}
		// An event parked earlier and applied now (a replay after a fix)
		// is no longer dead.
		return schema.ResolveDeadLetterTx(ctx, tx, ev.Group, ev.ID)
	})
	return outcome, err
}

// callHandler runs h, turning a panic into an error of the event rather
// than a crash of every lane.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, ev Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, tx, ev)
}

// Applied reports whether group has applied the event with the given ID:
// whether its inbox holds it.
func Applied(ctx context.Context, db schema.Executor, group, eventID string) (bool, error) {
	return schema.GroupApplied(ctx, db, group, eventID)
}

// permanentError marks a handler error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps a handler error that no retry can fix (a receiver that
// rejects the event as invalid): the event is parked at once instead of
// after MaxAttempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
