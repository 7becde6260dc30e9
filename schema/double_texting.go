package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DoubleTexting is a conversation's policy for a user message that
// arrives while a turn of the conversation runs: claimed, streaming, or
// waiting for an approval. It is stored on the conversation's row
// (migration 00023), so that every write path applies it: the producer
// function that stores a message (InsertMessageTx, the SQL producer's
// baton_send_message) rejects or interrupts, and the claim enqueues.
type DoubleTexting string

// The policies.
const (
	// DoubleTextingEnqueue answers the message after the running turn:
	// the claim takes one message of the conversation at a time, so each
	// message gets a turn and a reply of its own, in order, and the
	// running turn is never replaced.
	DoubleTextingEnqueue DoubleTexting = "enqueue"
	// DoubleTextingReject refuses the message while a turn runs or a
	// message waits for one (ErrTurnRunning, SQLSTATE PB012): nothing is
	// written.
	DoubleTextingReject DoubleTexting = "reject"
	// DoubleTextingInterrupt stores the message and asks the running turn
	// to stop, as StopTx asks it: the turn ends with what it had written,
	// marked stopped (and superseded), and its messages are answered again
	// with the new one in one turn. A turn that started a write ends as a
	// stop ends it once the write returned, and the new message is
	// answered alone. A turn that waits for an approval has the approval
	// denied, as a stop denies it, and its messages wait for the next
	// turn with the new one.
	DoubleTextingInterrupt DoubleTexting = "interrupt"
	// DoubleTextingDebounce leaves it to the worker's quiet window
	// (consumer.Config.Debounce): a message within it supersedes the
	// running turn unless that turn started a write, and the next turn
	// answers them all with one reply.
	DoubleTextingDebounce DoubleTexting = "debounce"
)

// DefaultDoubleTexting is the policy of a conversation created without
// one: the column's default, and the API's unless --double-texting says
// otherwise.
const DefaultDoubleTexting = DoubleTextingDebounce

// DoubleTextingPolicies are the policies, in the order the docs list
// them.
var DoubleTextingPolicies = []DoubleTexting{DoubleTextingEnqueue, DoubleTextingReject, DoubleTextingInterrupt, DoubleTextingDebounce}

// ParseDoubleTexting reads a policy by its name; an unknown name is an
// error that lists the policies.
func ParseDoubleTexting(s string) (DoubleTexting, error) {
	for _, p := range DoubleTextingPolicies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("double texting %q is not a policy: give %s", s, DoubleTextingNames())
}

// DoubleTextingNames lists the policies for a message: "enqueue, reject,
// interrupt or debounce".
func DoubleTextingNames() string {
	names := make([]string, len(DoubleTextingPolicies))
	for i, p := range DoubleTextingPolicies {
		names[i] = string(p)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// SetDoubleTexting sets the policy of ownerID's conversation of the given
// id and returns the conversation; another owner's, or none, is
// ErrNotFound. It applies to the messages stored after the commit: a turn
// already claimed keeps how its claim took its messages.
func SetDoubleTexting(ctx context.Context, db Executor, ownerID int64, id string, policy DoubleTexting) (Conversation, error) {
	if _, err := ParseDoubleTexting(string(policy)); err != nil {
		return Conversation{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c, err := scanConversation(db.QueryRow(ctx, `
		WITH updated AS (
			UPDATE conversations SET double_texting = $3 WHERE owner_id = $1 AND public_id = $2 RETURNING *)
		SELECT `+conversationColumns+` FROM updated c`, ownerID, id, string(policy)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Conversation{}, ErrNotFound
	}
	if err != nil {
		return Conversation{}, fmt.Errorf("set double texting: %w", err)
	}
	return c, nil
}
