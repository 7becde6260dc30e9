package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The reads of a chat client (the API's AI SDK adapter): a conversation's
// history with each reply's tool calls, and where the turn that answers a
// message stands.

// ChatMessage is a message as a chat client shows it.
type ChatMessage struct {
	// ID is a user message's own id (its public id), and the server's id
	// of a reply or a visible error.
	ID      string
	Role    string
	Content string
	// Reasoning is a reply's reasoning, empty when it has none.
	Reasoning string
	Seq       int64
	// Truncated marks a reply the model cut off; Stopped one that a stop
	// ended.
	Truncated, Stopped bool
	// Settled marks a user message that a stop settled before any turn
	// answered it.
	Settled bool
	// RunID is the run that wrote a reply or an error.
	RunID string
	// Tools are the tool calls of a reply or an error, in the order they
	// started.
	Tools []ChatTool
}

// ChatTool is one tool call of a reply, as its journal recorded it.
type ChatTool struct {
	CallID string
	Tool   string
	// Input is the call's JSON arguments.
	Input json.RawMessage
	// Status is started, completed, failed, or denied (a call that waited
	// for approval and was never sent).
	Status string
	// Output is a completed call's result.
	Output string
	// ApprovalID is the approval the call waited for, if it did.
	ApprovalID string
}

// Defaults and bounds of a page of ChatHistory.
const (
	DefaultChatPage = 100
	MaxChatPage     = 1000
)

// ChatHistory returns up to limit of ownerID's conversation's messages
// said before the cursor before (a page's next; "": the newest), oldest
// first, with the cursor of the page before it, "" when none is older.
// Replies that a regenerated one replaced are left out; a reply's tool
// calls come with it. A cursor that is not the conversation's is
// ErrBadCursor.
func ChatHistory(ctx context.Context, db Executor, ownerID int64, conversationID string, beforeCursor string, limit int) (msgs []ChatMessage, next string, err error) {
	c, err := GetConversation(ctx, db, ownerID, conversationID)
	if err != nil {
		return nil, "", err
	}
	var before int64
	if beforeCursor != "" {
		if before, err = c.Position(beforeCursor); err != nil {
			return nil, "", err
		}
		if before == 0 {
			return nil, "", ErrBadCursor
		}
	}
	msgs, more, err := chatHistory(ctx, db, c.Key, before, limit)
	if err != nil || !more {
		return msgs, "", err
	}
	return msgs, c.Cursor(msgs[0].Seq), nil
}

func chatHistory(ctx context.Context, db Executor, key string, before int64, limit int) (msgs []ChatMessage, more bool, err error) {
	rows, err := db.Query(ctx, `
		SELECT id, role, content, reasoning, seq, truncated, stopped, settled, run_id FROM (
			SELECT coalesce(m.public_id, m.id) AS id, m.role, m.content, coalesce(m.reasoning, '') AS reasoning, m.seq, m.truncated, m.stopped,
				o.stopped_at IS NOT NULL AS settled, coalesce(m.run_id, '') AS run_id
			FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
			WHERE m.conversation_id = $1 AND ($2 = 0 OR m.seq < $2) AND m.superseded_at IS NULL
			ORDER BY m.seq DESC LIMIT $3) page
		ORDER BY seq`, key, before, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("chat history: %w", err)
	}
	msgs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChatMessage, error) {
		var m ChatMessage
		err := row.Scan(&m.ID, &m.Role, &m.Content, &m.Reasoning, &m.Seq, &m.Truncated, &m.Stopped, &m.Settled, &m.RunID)
		return m, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("chat history: %w", err)
	}
	if len(msgs) > limit {
		msgs, more = msgs[1:], true
	}
	if err := attachTools(ctx, db, msgs); err != nil {
		return nil, false, err
	}
	return msgs, more, nil
}

// attachTools reads the tool calls of the replies and errors among msgs.
func attachTools(ctx context.Context, db Executor, msgs []ChatMessage) error {
	var ids, runs []string
	at := map[string]int{}
	for i, m := range msgs {
		if m.Role != RoleUser && m.RunID != "" {
			ids, runs = append(ids, m.ID), append(runs, m.RunID)
			at[m.ID] = i
		}
	}
	if len(ids) == 0 {
		return nil
	}
	// By run first: operations are indexed by (run_id, tool_call_id). A
	// reply also carries the calls of the runs of its turn that stopped
	// for an approval.
	rows, err := db.Query(ctx, `
		WITH r AS (
			SELECT unnest($1::text[]) AS run_id
			UNION
			SELECT a.run_id FROM messages m JOIN approvals a ON a.conversation_id = m.conversation_id AND a.turn_id = m.turn_id
			WHERE m.id = ANY($2))
		SELECT p.message_id, p.tool_call_id, p.tool, p.arguments::text, p.status, coalesce(p.result, ''),
			coalesce((SELECT a.public_id FROM approvals a WHERE a.conversation_id = p.conversation_id AND a.operation_id = p.id
				ORDER BY a.id DESC LIMIT 1), '')
		FROM operations p WHERE p.run_id IN (SELECT run_id FROM r) AND p.message_id = ANY($2)
		ORDER BY p.id`, runs, ids)
	if err != nil {
		return fmt.Errorf("tool calls of replies: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var messageID, input string
		var t ChatTool
		if err := rows.Scan(&messageID, &t.CallID, &t.Tool, &input, &t.Status, &t.Output, &t.ApprovalID); err != nil {
			return err
		}
		t.Input = json.RawMessage(input)
		if i, ok := at[messageID]; ok {
			msgs[i].Tools = append(msgs[i].Tools, t)
		}
	}
	return rows.Err()
}

// ChatReply returns the reply or visible error with the given id of the
// conversation with the given key, with its tool calls, or ErrNotFound.
func ChatReply(ctx context.Context, db Executor, conversationKey, messageID string) (ChatMessage, error) {
	var m ChatMessage
	err := db.QueryRow(ctx, `
		SELECT id, role, content, coalesce(reasoning, ''), seq, truncated, stopped, coalesce(run_id, '') FROM messages
		WHERE id = $1 AND conversation_id = $2 AND role IN ('assistant', 'error')`, messageID, conversationKey).
		Scan(&m.ID, &m.Role, &m.Content, &m.Reasoning, &m.Seq, &m.Truncated, &m.Stopped, &m.RunID)
	if errors.Is(err, pgx.ErrNoRows) {
		return ChatMessage{}, ErrNotFound
	}
	if err != nil {
		return ChatMessage{}, fmt.Errorf("read reply: %w", err)
	}
	msgs := []ChatMessage{m}
	if err := attachTools(ctx, db, msgs); err != nil {
		return ChatMessage{}, err
	}
	return msgs[0], nil
}

// RowTurn says where the turn that answers one outbox row stands.
type RowTurn struct {
	// Status is the row's: pending, processing, done or error.
	Status string
	// RunID is the run that claimed the row last: while processing, the
	// one running it.
	RunID string
	// Generation is the row's.
	Generation int
	// Settled is set when a stop settled the row before a turn answered
	// it: it is done, with no reply.
	Settled bool
	// ReplyID is the reply or visible error of the run that settled the
	// row (done or error); empty when none is known.
	ReplyID string
	// RunReplyID is, while the row is processing, the id the running
	// turn's reply will have (Claim.ReplyID).
	RunReplyID string
}

// ReadRowTurn reads where the turn of an outbox row of the conversation
// with the given key stands, or ErrNotFound.
func ReadRowTurn(ctx context.Context, db Executor, conversationKey string, outboxID int64) (RowTurn, error) {
	var t RowTurn
	err := db.QueryRow(ctx, `
		SELECT o.status, coalesce(o.run_id, ''), o.generation, o.stopped_at IS NOT NULL,
			CASE WHEN o.status IN ('done', 'error') AND o.run_id IS NOT NULL THEN coalesce(
				(SELECT a.reply_message_id FROM agent_runs a WHERE a.id = o.run_id),
				(SELECT m.id FROM messages m WHERE m.conversation_id = o.conversation_id AND m.run_id = o.run_id
					AND m.role IN ('assistant', 'error') ORDER BY m.seq DESC LIMIT 1), '') ELSE '' END,
			coalesce((SELECT baton_reply_id(o.conversation_id, a.outbox_ids,
				(SELECT coalesce(max(x.generation), 0) FROM agent_outbox x WHERE x.id = ANY(a.outbox_ids)))
				FROM agent_runs a WHERE a.id = o.run_id AND o.status = 'processing'), '')
		FROM agent_outbox o WHERE o.id = $1 AND o.conversation_id = $2`, outboxID, conversationKey).
		Scan(&t.Status, &t.RunID, &t.Generation, &t.Settled, &t.ReplyID, &t.RunReplyID)
	if errors.Is(err, pgx.ErrNoRows) {
		return RowTurn{}, ErrNotFound
	}
	if err != nil {
		return RowTurn{}, fmt.Errorf("read the turn of outbox row %d: %w", outboxID, err)
	}
	return t, nil
}

// ActiveRow returns the outbox row whose turn a client resuming the
// conversation with the given key follows: the oldest row of the running
// turn, else the oldest row waiting for one. ok is false when nothing runs
// or waits.
func ActiveRow(ctx context.Context, db Executor, conversationKey string) (outboxID int64, ok bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT id FROM agent_outbox WHERE conversation_id = $1 AND status IN ('processing', 'pending')
		ORDER BY status = 'pending', id LIMIT 1`, conversationKey).Scan(&outboxID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("find the running turn: %w", err)
	}
	return outboxID, true, nil
}

// ChatApproval is a call that the turn answering an outbox row waits for
// its user to approve or deny.
type ChatApproval struct {
	// ID is the approval's public id.
	ID         string
	ToolCallID string
	Tool       string
	// Arguments are the call's stored JSON arguments.
	Arguments json.RawMessage
	// ReplyID is the id the turn's reply will have: the turn resumes as
	// the same turn.
	ReplyID string
	// Text and Reasoning are what the turn's journaled steps said before
	// it stopped, a paragraph each step, as its reply will hold them.
	Text, Reasoning string
}

// WaitingApproval returns the approval that an outbox row of the
// conversation with the given key waits for, while it waits (pending and
// in time); nil when it waits for none. That is the approval the
// conversation waits for: the one its row's turn stopped at, or, for a
// row that came after, the one that holds every turn of the conversation
// until it is decided.
func WaitingApproval(ctx context.Context, db Executor, conversationKey string, outboxID int64) (*ChatApproval, error) {
	var a ChatApproval
	var args string
	err := db.QueryRow(ctx, `
		SELECT a.public_id, coalesce(o.tool_call_id, a.question->>'tool_call_id', ''), a.tool, a.arguments::text,
			baton_reply_id(c.id, a.outbox_ids, (SELECT coalesce(max(x.generation), 0) FROM agent_outbox x WHERE x.id = ANY(a.outbox_ids))),
			coalesce(j.text, ''), coalesce(j.reasoning, '')
		FROM conversations c JOIN approvals a ON a.id = c.approval_id
		LEFT JOIN operations o ON o.id = a.operation_id
		LEFT JOIN LATERAL (
			SELECT string_agg(s.answer->>'text', E'\n\n' ORDER BY s.step) FILTER (WHERE coalesce(s.answer->>'text', '') <> '') AS text,
				string_agg(s.answer->>'reasoning', E'\n\n' ORDER BY s.step) FILTER (WHERE coalesce(s.answer->>'reasoning', '') <> '') AS reasoning
			FROM agent_steps s
			WHERE s.conversation_id = c.id AND s.turn_id = coalesce(o.turn_id, a.turn_id) AND s.epoch = coalesce(o.epoch, a.epoch)
		) j ON true
		WHERE c.id = $1 AND a.status = 'pending' AND a.expires_at > now()
			AND EXISTS (SELECT 1 FROM agent_outbox x WHERE x.id = $2 AND x.conversation_id = c.id AND x.status = 'pending')`,
		conversationKey, outboxID).Scan(&a.ID, &a.ToolCallID, &a.Tool, &args, &a.ReplyID, &a.Text, &a.Reasoning)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the approval a turn waits for: %w", err)
	}
	a.Arguments = json.RawMessage(args)
	return &a, nil
}
