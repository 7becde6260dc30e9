package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TurnState is the state of a conversation's work, derived from its outbox
// rows.
type TurnState string

const (
	TurnIdle    TurnState = "idle"
	TurnPending TurnState = "pending"
	// TurnWaiting: pending, and the model server asked to wait before the
	// next attempt.
	TurnWaiting    TurnState = "waiting"
	TurnProcessing TurnState = "processing"
	TurnFailed     TurnState = "failed"
	// TurnWaitingForApproval: the turn stopped at a call that a person
	// must approve or deny; nothing runs until then.
	TurnWaitingForApproval TurnState = "waiting_for_approval"
)

// Conversation is one conversation with its metadata. ID is the owner's
// id for it; Key is the server's, unique across owners, and the one every
// table, subject and stream uses. Clients never see Key.
type Conversation struct {
	ID  string `json:"id"`
	Key string `json:"-"`
	// RunID is the run that holds the conversation's lease, if any.
	RunID         string     `json:"-"`
	Title         string     `json:"title"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	LastMessageAt *time.Time `json:"last_message_at"`
	UnreadCount   int        `json:"unread_count"`
	TurnState     TurnState  `json:"turn_state"`
	// DoubleTexting is what a message does that arrives while a turn
	// runs.
	DoubleTexting DoubleTexting `json:"double_texting"`
	// Salt is the conversation's secret: its turn and reply ids and its
	// cursors derive from it (see Cursor). Clients never see it.
	Salt []byte `json:"-"`
}

// CreateConversation creates a conversation owned by ownerID under the
// owner's id for it, with the default policy (DefaultDoubleTexting); see
// CreateConversationWith.
func CreateConversation(ctx context.Context, db Executor, ownerID int64, id, title string) (c Conversation, created bool, err error) {
	return CreateConversationWith(ctx, db, ownerID, NewConversation{ID: id, Title: title})
}

// NewConversation is a conversation to create.
type NewConversation struct {
	// ID is the owner's id for it.
	ID    string
	Title string
	// DoubleTexting is its policy for a message that arrives while a
	// turn runs. Defaults to DefaultDoubleTexting (the column's default).
	DoubleTexting DoubleTexting
}

// CreateConversationWith creates a conversation owned by ownerID. Creating
// an existing conversation of the same owner again is not an error
// (created is false), and changes nothing: neither its title nor its
// policy. Ids are per owner: another owner's conversation of the same id
// is a different conversation. A bad id, a title over MaxTitleLength or
// one that text cannot hold (ErrBadText), or a policy that is not one is
// ErrInvalid and creates nothing.
//
// It is one call of the SQL function baton_create_conversation_for_owner
// (migrations 00015 and 00023), which the SQL producer's
// baton_create_conversation calls too.
func CreateConversationWith(ctx context.Context, db Executor, ownerID int64, n NewConversation) (c Conversation, created bool, err error) {
	if err := ValidateText("title", n.Title); err != nil {
		return Conversation{}, false, err
	}
	var policy *string
	if n.DoubleTexting != "" {
		policy = (*string)(&n.DoubleTexting)
	}
	var existed bool
	err = db.QueryRow(ctx, `SELECT existed FROM baton_create_conversation_for_owner($1, $2, $3, $4)`, ownerID, n.ID, n.Title, policy).Scan(&existed)
	if err != nil {
		return Conversation{}, false, producerError("create conversation", err)
	}
	c, err = GetConversation(ctx, db, ownerID, n.ID)
	return c, !existed, err
}

const conversationColumns = `
	c.public_id, c.id, coalesce(c.run_id, ''), c.title, c.created_at, c.updated_at, c.last_message_at, c.unread_count,
	CASE
		WHEN EXISTS (SELECT 1 FROM agent_outbox o WHERE o.conversation_id = c.id AND o.status = 'processing') THEN 'processing'
		WHEN c.approval_id IS NOT NULL AND EXISTS (SELECT 1 FROM approvals a WHERE a.id = c.approval_id AND a.status = 'pending')
			THEN 'waiting_for_approval'
		WHEN EXISTS (SELECT 1 FROM agent_outbox o WHERE o.conversation_id = c.id AND o.status = 'pending')
			THEN CASE WHEN c.not_before > now() THEN 'waiting' ELSE 'pending' END
		WHEN (SELECT o.status FROM agent_outbox o WHERE o.conversation_id = c.id ORDER BY o.id DESC LIMIT 1) = 'error' THEN 'failed'
		ELSE 'idle'
	END, c.double_texting, c.id_salt`

func scanConversation(row pgx.Row) (Conversation, error) {
	var c Conversation
	var state, policy string
	err := row.Scan(&c.ID, &c.Key, &c.RunID, &c.Title, &c.CreatedAt, &c.UpdatedAt, &c.LastMessageAt, &c.UnreadCount, &state, &policy, &c.Salt)
	c.TurnState, c.DoubleTexting = TurnState(state), DoubleTexting(policy)
	return c, err
}

// GetConversation returns ownerID's conversation of the given id, or
// ErrNotFound: the same whether no conversation has that id or another
// owner's has.
func GetConversation(ctx context.Context, db Executor, ownerID int64, id string) (Conversation, error) {
	c, err := scanConversation(db.QueryRow(ctx, `SELECT `+conversationColumns+` FROM conversations c WHERE c.owner_id = $1 AND c.public_id = $2`, ownerID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Conversation{}, ErrNotFound
	}
	return c, err
}

// ConversationByKey returns the conversation with the given key if ownerID
// still owns it, or ErrNotFound: a live stream checks again that what it
// follows still exists and is still its user's.
func ConversationByKey(ctx context.Context, db Executor, ownerID int64, key string) (Conversation, error) {
	c, err := scanConversation(db.QueryRow(ctx, `SELECT `+conversationColumns+` FROM conversations c WHERE c.id = $1 AND c.owner_id = $2`, key, ownerID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Conversation{}, ErrNotFound
	}
	return c, err
}

// CountConversations returns how many conversations ownerID has.
func CountConversations(ctx context.Context, db Executor, ownerID int64) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM conversations WHERE owner_id = $1`, ownerID).Scan(&n)
	return n, err
}

// ListConversations returns ownerID's conversations, most recently updated
// first.
func ListConversations(ctx context.Context, db Executor, ownerID int64, limit int) ([]Conversation, error) {
	rows, err := db.Query(ctx, `SELECT `+conversationColumns+` FROM conversations c WHERE c.owner_id = $1 ORDER BY c.updated_at DESC, c.id LIMIT $2`, ownerID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Conversation{}
	for rows.Next() {
		c, err := scanConversation(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// DeleteConversation deletes ownerID's conversation of the given id with
// its messages, outbox rows, runs and operations (ON DELETE CASCADE), and
// returns its key. A turn running at that moment fails its finalize on the
// foreign key and is cancelled.
func DeleteConversation(ctx context.Context, db Executor, ownerID int64, id string) (key string, err error) {
	err = db.QueryRow(ctx, `DELETE FROM conversations WHERE owner_id = $1 AND public_id = $2 RETURNING id`, ownerID, id).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return key, err
}

// DeleteEmptyConversation deletes ownerID's conversation of the given id
// when it holds no message, and reports whether it did: a caller that
// created it for a message that was then refused leaves nothing behind.
func DeleteEmptyConversation(ctx context.Context, db Executor, ownerID int64, id string) (bool, error) {
	tag, err := db.Exec(ctx, `
		DELETE FROM conversations c WHERE c.owner_id = $1 AND c.public_id = $2
		AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id)`, ownerID, id)
	if err != nil {
		return false, fmt.Errorf("delete empty conversation: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// MarkRead resets the unread count of a conversation.
func MarkRead(ctx context.Context, db Executor, ownerID int64, id string) error {
	tag, err := db.Exec(ctx, `UPDATE conversations SET unread_count = 0 WHERE owner_id = $1 AND public_id = $2`, ownerID, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
