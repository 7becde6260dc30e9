package consumer

// State is a conversation's turn state after a commit, as clients see it.
type State string

const (
	// StateProcessing: a run claimed the conversation's pending messages.
	StateProcessing State = "processing"
	// StateReplied: the turn's reply committed.
	StateReplied State = "replied"
	// StatePending: an attempt failed or was recovered, and its messages
	// wait for another attempt.
	StatePending State = "pending"
	// StateFailed: the turn gave up; a visible error message committed.
	StateFailed State = "failed"
	// StateCancelled: the conversation was deleted during the turn.
	StateCancelled State = "cancelled"
)

// StateChange is a committed change of a conversation's turn state. It is
// reported only after the transaction that made it committed, so whoever
// publishes it never announces what did not happen.
type StateChange struct {
	ConversationID string
	RunID          string
	TurnID         string
	State          State
	OutboxIDs      []int64
	// MessageID is the reply (StateReplied) or the error message
	// (StateFailed).
	MessageID string
}
