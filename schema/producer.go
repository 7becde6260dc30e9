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

// Message is one message of a conversation.
type Message struct {
	ID             string    `json:"id"`
	ConversationID string    `json:"conversation_id"`
	Role           string    `json:"role"`
	Content        string    `json:"content"`
	CreatedAt      time.Time `json:"created_at"`
	// Status is the outbox status of a user message (pending, processing,
	// done, error); nil for other roles.
	Status *string `json:"status,omitempty"`
	// Seq orders the messages of a conversation.
	Seq int64 `json:"seq"`
}

// UserMessage is what a producer writes: a client-chosen message ID, the
// conversation it belongs to, and its content. Nothing else: a client never
// chooses statuses, attempts or outbox fields.
type UserMessage struct {
	ConversationID string
	MessageID      string
	Content        string
}

// InsertResult says what InsertMessageTx did.
type InsertResult struct {
	Message Message
	// OutboxID is the outbox row of the message.
	OutboxID int64
	// Existed is true when the message had been stored before (a client
	// retry): no second outbox row was written and no second turn follows.
	Existed bool
}

// InsertMessageTx stores a user message and its outbox row in the caller's
// transaction, and touches the conversation's ordering and unread metadata
// in it too. The message ID is the idempotency key: calling it again with
// the same ID and content writes nothing and reports Existed; the same ID
// with other content, or in another conversation, is ErrConflict. An unknown
// conversation is ErrNotFound.
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
	res.Message = Message{ID: m.MessageID, ConversationID: m.ConversationID, Role: RoleUser, Content: m.Content}
	err := tx.QueryRow(ctx, `
		INSERT INTO messages (id, conversation_id, role, content)
		VALUES ($1, $2, 'user', $3)
		ON CONFLICT (id) DO NOTHING
		RETURNING seq, created_at`, m.MessageID, m.ConversationID, m.Content).Scan(&res.Message.Seq, &res.Message.CreatedAt)
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
		INSERT INTO agent_outbox (conversation_id, message_id) VALUES ($1, $2)
		RETURNING id`, m.ConversationID, m.MessageID).Scan(&res.OutboxID); err != nil {
		return InsertResult{}, fmt.Errorf("insert outbox row: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations
		SET updated_at = now(), last_message_at = now()
		WHERE id = $1`, m.ConversationID); err != nil {
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
	err := tx.QueryRow(ctx, `
		SELECT m.conversation_id, m.role, m.content, m.seq, m.created_at, o.id, o.status
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.id = $1`, m.MessageID).Scan(
		&res.Message.ConversationID, &res.Message.Role, &res.Message.Content,
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
	res.Message.Status = status
	if outboxID != nil {
		res.OutboxID = *outboxID
	}
	if res.Message.ConversationID != m.ConversationID || res.Message.Role != RoleUser || res.Message.Content != m.Content {
		return InsertResult{}, fmt.Errorf("%w: message id %q was already used for different content; use a new id for a new message", ErrConflict, m.MessageID)
	}
	res.Existed = true
	return res, nil
}

// ListMessages returns the messages of ownerID's conversation, oldest
// first, each user message with its outbox status.
func ListMessages(ctx context.Context, db Executor, ownerID int64, conversationID string) ([]Message, error) {
	if _, err := GetConversation(ctx, db, ownerID, conversationID); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT m.id, m.conversation_id, m.role, m.content, m.created_at, m.seq, o.status
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1
		ORDER BY m.seq`, conversationID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Message{}
	for rows.Next() {
		var msg Message
		if err := rows.Scan(&msg.ID, &msg.ConversationID, &msg.Role, &msg.Content, &msg.CreatedAt, &msg.Seq, &msg.Status); err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	return out, rows.Err()
}
