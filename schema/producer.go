package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	// RoleError is the visible outcome of a turn that gave up.
	RoleError = "error"
)

// Message is one message of a conversation. To clients, ID is a user
// message's own id (its public id) and the server's id of a reply or an
// error, and ConversationID is the owner's id of the conversation; inside
// a turn (LoadTurn) both are the server's keys.
type Message struct {
	ID             string    `json:"id"`
	ConversationID string    `json:"conversation_id"`
	Role           string    `json:"role"`
	Content        string    `json:"content"`
	CreatedAt      time.Time `json:"created_at"`
	// Status is the outbox status of a user message (pending, processing,
	// done, error); nil for other roles.
	Status *string `json:"status,omitempty"`
	// Seq orders the messages of a conversation; it is also the cursor of
	// ListMessages.
	Seq int64 `json:"seq"`
	// Truncated marks a reply the model cut off before its end.
	Truncated bool `json:"truncated,omitempty"`
	// Stopped marks a reply that a stop ended: what the run had written.
	Stopped bool `json:"stopped,omitempty"`
	// Superseded marks a reply that a regenerated one replaced.
	Superseded bool `json:"superseded,omitempty"`
}

// UserMessage is what a producer writes: whose it is, the owner's ids of
// the conversation and of the message (chosen by the client), and the
// content. Nothing else: a client never chooses statuses, attempts or
// outbox fields.
type UserMessage struct {
	OwnerID        int64
	ConversationID string
	MessageID      string
	Content        string
	// TraceParent is the W3C trace context of the request, kept on the
	// outbox row so that the turn continues the caller's trace. Defaults
	// to none.
	TraceParent string
}

// InsertResult says what InsertMessageTx did.
type InsertResult struct {
	// Message is the stored message as its owner sees it.
	Message Message
	// ConversationKey and MessageKey are the server's keys of the
	// conversation and the message.
	ConversationKey string
	MessageKey      string
	// OutboxID is the outbox row of the message.
	OutboxID int64
	// Existed is true when the message had been stored before (a client
	// retry): no second outbox row was written and no second turn follows.
	Existed bool
}

// InsertMessageTx stores a user message and its outbox row in the caller's
// transaction, and touches the conversation's ordering and unread metadata
// in it too. The owner's message id is the idempotency key: calling it
// again with the same id and content writes nothing and reports Existed;
// the same id with other content, or in another of the owner's
// conversations, is ErrConflict. A conversation the owner does not have is
// ErrNotFound.
//
// The conversation row is locked first and updated last, in the same
// transaction as the outbox row: a worker's claim, which locks that row,
// cannot see the outbox row before this transaction's commit is visible to
// it (see ClaimTx).
//
// The caller commits: the message and its outbox row become visible
// together, or not at all.
func InsertMessageTx(ctx context.Context, tx Executor, m UserMessage) (InsertResult, error) {
	if err := ValidateID("conversation", m.ConversationID); err != nil {
		return InsertResult{}, err
	}
	if err := ValidateID("message", m.MessageID); err != nil {
		return InsertResult{}, err
	}
	var res InsertResult
	err := tx.QueryRow(ctx, `
		SELECT id FROM conversations WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`,
		m.OwnerID, m.ConversationID).Scan(&res.ConversationKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return InsertResult{}, fmt.Errorf("%w: conversation %q does not exist", ErrNotFound, m.ConversationID)
	}
	if err != nil {
		return InsertResult{}, fmt.Errorf("lock conversation: %w", err)
	}
	res.Message = Message{ID: m.MessageID, ConversationID: m.ConversationID, Role: RoleUser, Content: m.Content}
	err = tx.QueryRow(ctx, `
		INSERT INTO messages (id, public_id, owner_id, conversation_id, role, content)
		VALUES ($1, $2, $3, $4, 'user', $5)
		ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
		RETURNING id, seq, created_at`, newKey("m_"), m.MessageID, m.OwnerID, res.ConversationKey, m.Content).
		Scan(&res.MessageKey, &res.Message.Seq, &res.Message.CreatedAt)
	switch {
	case err == nil:
		// Inserted: the outbox row and the conversation metadata follow in
		// the same transaction.
	case errors.Is(err, pgx.ErrNoRows):
		return existingMessage(ctx, tx, m)
	case IsForeignKeyViolation(err):
		return InsertResult{}, fmt.Errorf("%w: conversation %q does not exist", ErrNotFound, m.ConversationID)
	default:
		return InsertResult{}, fmt.Errorf("insert message: %w", err)
	}
	if err := tx.QueryRow(ctx, `
		INSERT INTO agent_outbox (conversation_id, message_id, trace_parent) VALUES ($1, $2, NULLIF($3, ''))
		RETURNING id`, res.ConversationKey, res.MessageKey, m.TraceParent).Scan(&res.OutboxID); err != nil {
		return InsertResult{}, fmt.Errorf("insert outbox row: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations
		SET updated_at = now(), last_message_at = now()
		WHERE id = $1`, res.ConversationKey); err != nil {
		return InsertResult{}, fmt.Errorf("touch conversation: %w", err)
	}
	status := "pending"
	res.Message.Status = &status
	return res, nil
}

// existingMessage resolves a retry: the same message again, or a conflict.
func existingMessage(ctx context.Context, tx Executor, m UserMessage) (InsertResult, error) {
	var res InsertResult
	var status *string
	var outboxID *int64
	var conversationID string
	err := tx.QueryRow(ctx, `
		SELECT m.id, m.conversation_id, c.public_id, m.content, m.seq, m.created_at, o.id, o.status
		FROM messages m JOIN conversations c ON c.id = m.conversation_id
		LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.owner_id = $1 AND m.public_id = $2`, m.OwnerID, m.MessageID).Scan(
		&res.MessageKey, &res.ConversationKey, &conversationID, &res.Message.Content,
		&res.Message.Seq, &res.Message.CreatedAt, &outboxID, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		// Deleted between the insert attempt and this read, with its
		// conversation: nothing to report but a missing conversation.
		return InsertResult{}, fmt.Errorf("%w: conversation %q does not exist", ErrNotFound, m.ConversationID)
	}
	if err != nil {
		return InsertResult{}, fmt.Errorf("read existing message: %w", err)
	}
	res.Message.ID = m.MessageID
	res.Message.ConversationID = conversationID
	res.Message.Role = RoleUser
	res.Message.Status = status
	if outboxID != nil {
		res.OutboxID = *outboxID
	}
	if conversationID != m.ConversationID || res.Message.Content != m.Content {
		return InsertResult{}, fmt.Errorf("%w: message id %q was already used for different content; use a new id for a new message", ErrConflict, m.MessageID)
	}
	res.Existed = true
	return res, nil
}

// Defaults and bounds of a page of ListMessages.
const (
	DefaultMessagePage = 100
	MaxMessagePage     = 1000
)

// ListMessages returns up to limit messages of ownerID's conversation with
// the given id, oldest first, after the message whose Seq is after (0 for
// the start), each user message with its outbox status (or "stopped",
// for one a stop settled before a turn answered it). The last
// message's Seq is the cursor of the next page.
func ListMessages(ctx context.Context, db Executor, ownerID int64, conversationID string, after int64, limit int) ([]Message, error) {
	c, err := GetConversation(ctx, db, ownerID, conversationID)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT coalesce(m.public_id, m.id), m.role, m.content, m.created_at, m.seq,
			CASE WHEN o.stopped_at IS NOT NULL THEN 'stopped' ELSE o.status END, m.truncated, m.stopped, m.superseded_at IS NOT NULL
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND m.seq > $2
		ORDER BY m.seq
		LIMIT $3`, c.Key, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Message{}
	for rows.Next() {
		msg := Message{ConversationID: conversationID}
		if err := rows.Scan(&msg.ID, &msg.Role, &msg.Content, &msg.CreatedAt, &msg.Seq, &msg.Status, &msg.Truncated, &msg.Stopped, &msg.Superseded); err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	return out, rows.Err()
}
