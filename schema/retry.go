package schema

import (
	"context"
	"fmt"
)

// RetryFailedTx puts a conversation's failed outbox rows back to pending
// with a fresh attempt budget, at the user's request, and returns their
// IDs. The visible error messages stay in the conversation: nothing about
// the failure is deleted. The caller announces the rows in the same
// transaction (relay.AnnounceTx).
func RetryFailedTx(ctx context.Context, tx Executor, ownerID int64, conversationID string) ([]int64, error) {
	if _, err := GetConversation(ctx, tx, ownerID, conversationID); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `
		UPDATE agent_outbox
		SET status = 'pending', attempts = 0, processed_at = NULL, run_id = NULL, announced_at = now()
		WHERE conversation_id = $1 AND status = 'error'
		RETURNING id`, conversationID)
	if err != nil {
		return nil, fmt.Errorf("retry failed rows: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
