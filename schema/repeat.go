package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrTurnMadeWrites: a turn that a user asked to answer again (a retry, a
// regenerate) made writes, which a new answer would make again; the user
// did not say to repeat them. Every *WritesError is one.
var ErrTurnMadeWrites = errors.New("the turn made writes")

// WritesError is ErrTurnMadeWrites with the tools whose writes the turn
// made.
type WritesError struct {
	// Tools are the tools of the writes, once each, sorted.
	Tools []string
}

func (e *WritesError) Error() string {
	return fmt.Sprintf("the turn made writes (%s): answering it again runs them again", strings.Join(e.Tools, ", "))
}

func (e *WritesError) Unwrap() error { return ErrTurnMadeWrites }

// checkRepeatTx returns a *WritesError when a run that answered any of
// the outbox rows made a write: one completed, or started and never
// settled (its outcome unknown), which a new answer to the rows would
// make again, unless repeat says the user wants that. Reads, and writes
// that failed, were denied or never left, do not count.
func checkRepeatTx(ctx context.Context, tx Executor, conversationKey string, rows []int64, repeat bool) error {
	if repeat || len(rows) == 0 {
		return nil
	}
	var tools []string
	err := tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(DISTINCT p.tool ORDER BY p.tool), '{}') FROM operations p
		WHERE p.conversation_id = $1 AND p.effect = 'write' AND p.status IN ('completed', 'started', 'unknown')
			AND EXISTS (SELECT 1 FROM agent_runs r WHERE r.id = p.run_id AND r.outbox_ids && $2::bigint[])`,
		conversationKey, rows).Scan(&tools)
	if err != nil {
		return fmt.Errorf("find the writes of the turn: %w", err)
	}
	if len(tools) > 0 {
		return &WritesError{Tools: tools}
	}
	return nil
}
