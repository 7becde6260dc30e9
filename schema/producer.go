package schema

import (
	"context"
	"time"
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
	ID             string `json:"id"`
	ConversationID string `json:"conversation_id"`
	Role           string `json:"role"`
	Content        string `json:"content"`
	// Reasoning is a reply's reasoning: what the model thought before it
	// answered, shown apart from Content. Loaded by ListMessages only, and
	// never given back to an agent.
	Reasoning string    `json:"reasoning,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Status is the outbox status of a user message (pending, processing,
	// done, error); nil for other roles.
	Status *string `json:"status,omitempty"`
	// Seq orders the messages of the whole server; clients never see it
	// (it would count every message). A page's cursor holds it encrypted
	// (Conversation.Cursor).
	Seq int64 `json:"-"`
	// Truncated marks a reply the model cut off before its end.
	Truncated bool `json:"truncated,omitempty"`
	// Stopped marks a reply that a stop ended: what the run had written.
	Stopped bool `json:"stopped,omitempty"`
	// Superseded marks a reply that a regenerated one replaced.
	Superseded bool `json:"superseded,omitempty"`
	// Files are a user message's files, in order: references to its
	// owner's store (FileStore), never the bytes.
	Files []File `json:"files,omitempty"`
	// Key is the server's id of the message.
	Key string `json:"-"`
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
	// Files are the message's files, stored in the owner's store before
	// the outbox row; a message with files may have empty Content.
	// Defaults to none.
	Files []FileIn
	// FileLimits are the policies the files are held to. Defaults to
	// FileLimits' defaults.
	FileLimits FileLimits
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
	// InterruptedRunID is the run that this message asked to stop, under
	// the conversation's DoubleTextingInterrupt; empty when none. After
	// the commit, tell its worker as a stop is told
	// (nats.StopSubject(ConversationKey, InterruptedRunID)); a worker
	// that hears nothing learns it when the message's trigger reaches it,
	// or at its next lease renewal.
	InterruptedRunID string
}

// InsertMessageTx stores a user message and its outbox row in the caller's
// transaction, and touches the conversation's ordering and unread metadata
// in it too. The owner's message id is the idempotency key: calling it
// again with the same id and content writes nothing and reports Existed;
// the same id with other content, or in another of the owner's
// conversations, is ErrConflict. A conversation the owner does not have is
// ErrNotFound; a bad id, empty content or content that text cannot hold
// (U+0000, invalid UTF-8: ErrBadText) ErrInvalid, a message id of the
// server's (ValidateID) ErrReservedID; content over
// MaxContentBytes ErrContentTooLarge; files that FileLimits refuse
// ErrFileTooLarge, ErrTooManyFiles, ErrFileQuota, ErrMediaType or
// ErrBadFile. On an error nothing is written.
//
// The conversation's double texting applies (see DoubleTexting): under
// DoubleTextingReject, a new message while a turn runs or waits is
// ErrTurnRunning (a *ProducerError whose message names the approval the
// turn waits for, if any); under DoubleTextingInterrupt, the running turn
// is asked to stop in this transaction (InterruptedRunID).
//
// It is one call of the SQL function baton_send_message_for_owner
// (migration 00015), the write path that the SQL producer's
// baton_send_message takes too: the conversation row is locked first and
// updated last, in the same transaction as the outbox row, so that a
// worker's claim, which locks that row, cannot see the outbox row before
// this transaction's commit is visible to it (see ClaimTx).
//
// The caller commits: the message and its outbox row become visible
// together, or not at all. Given a pool, the call is a transaction of its
// own, one round trip (the API's path).
func InsertMessageTx(ctx context.Context, tx Executor, m UserMessage) (InsertResult, error) {
	if m.Content != "" || len(m.Files) == 0 {
		if err := ValidateText("content", m.Content); err != nil {
			return InsertResult{}, err
		}
	}
	res := InsertResult{Message: Message{ID: m.MessageID, ConversationID: m.ConversationID, Role: RoleUser, Content: m.Content}}
	var outboxID *int64
	var interrupted *string
	var sums, types []string
	var sizes []int64
	var err error
	if len(m.Files) == 0 {
		// The statement of a message without files, as it was before
		// files: nothing more to send or to read.
		err = tx.QueryRow(ctx, `
			SELECT conversation_key, message_key, outbox_id, message_seq, message_created_at, outbox_status, existed, interrupted_run_id
			FROM baton_send_message_for_owner($1, $2, $3, $4, $5)`,
			m.OwnerID, m.ConversationID, m.MessageID, m.Content, m.TraceParent).Scan(
			&res.ConversationKey, &res.MessageKey, &outboxID, &res.Message.Seq, &res.Message.CreatedAt, &res.Message.Status, &res.Existed, &interrupted)
	} else {
		meta, data := fileArgs(m.Files)
		err = tx.QueryRow(ctx, `
			SELECT conversation_key, message_key, outbox_id, message_seq, message_created_at, outbox_status, existed, interrupted_run_id,
				file_sha256s, file_media_types, file_sizes
			FROM baton_send_message_for_owner($1, $2, $3, $4, $5, $6, $7, $8)`,
			m.OwnerID, m.ConversationID, m.MessageID, m.Content, m.TraceParent, meta, data, m.FileLimits.sqlLimits()).Scan(
			&res.ConversationKey, &res.MessageKey, &outboxID, &res.Message.Seq, &res.Message.CreatedAt, &res.Message.Status, &res.Existed, &interrupted,
			&sums, &types, &sizes)
	}
	if err != nil {
		return InsertResult{}, producerError("store the message", err)
	}
	for i := range sums {
		res.Message.Files = append(res.Message.Files, File{SHA256: sums[i], MediaType: types[i], Filename: m.Files[i].Filename, Size: sizes[i], Owner: m.OwnerID})
	}
	res.Message.Key = res.MessageKey
	if outboxID != nil {
		// A retry of a message whose outbox row was pruned has none.
		res.OutboxID = *outboxID
	}
	if interrupted != nil {
		res.InterruptedRunID = *interrupted
	}
	return res, nil
}

// Defaults and bounds of a page of ListMessages.
const (
	DefaultMessagePage = 100
	MaxMessagePage     = 1000
)

// ListMessages returns up to limit messages of ownerID's conversation with
// the given id, oldest first, after the cursor after (a page's next, ""
// for the start), each user message with its outbox status (or "stopped",
// for one a stop settled before a turn answered it), and the cursor of
// the next page, "" when none follows. A cursor that is not the
// conversation's is ErrBadCursor.
func ListMessages(ctx context.Context, db Executor, ownerID int64, conversationID string, after string, limit int) (msgs []Message, next string, err error) {
	c, err := GetConversation(ctx, db, ownerID, conversationID)
	if err != nil {
		return nil, "", err
	}
	var from int64
	if after != "" {
		if from, err = c.Position(after); err != nil {
			return nil, "", err
		}
	}
	// One more than asked tells whether another page follows.
	msgs, err = listMessages(ctx, db, c.Key, conversationID, from, limit+1)
	if err != nil || len(msgs) <= limit {
		return msgs, "", err
	}
	msgs = msgs[:limit]
	return msgs, c.Cursor(msgs[limit-1].Seq), nil
}

func listMessages(ctx context.Context, db Executor, key, conversationID string, after int64, limit int) ([]Message, error) {
	rows, err := db.Query(ctx, `
		SELECT m.id, coalesce(m.public_id, m.id), m.role, m.content, coalesce(m.reasoning, ''), m.created_at, m.seq,
			CASE WHEN o.stopped_at IS NOT NULL THEN 'stopped' ELSE o.status END, m.truncated, m.stopped, m.superseded_at IS NOT NULL
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND m.seq > $2
		ORDER BY m.seq
		LIMIT $3`, key, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Message{}
	for rows.Next() {
		msg := Message{ConversationID: conversationID}
		if err := rows.Scan(&msg.Key, &msg.ID, &msg.Role, &msg.Content, &msg.Reasoning, &msg.CreatedAt, &msg.Seq, &msg.Status, &msg.Truncated, &msg.Stopped, &msg.Superseded); err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, attachFiles(ctx, db, out)
}

// attachFiles reads the files of the user messages among msgs.
func attachFiles(ctx context.Context, db Executor, msgs []Message) error {
	var keys []string
	for _, m := range msgs {
		if m.Role == RoleUser {
			keys = append(keys, m.Key)
		}
	}
	files, err := FilesOf(ctx, db, keys)
	if err != nil {
		return err
	}
	for i := range msgs {
		msgs[i].Files = files[msgs[i].Key]
	}
	return nil
}
