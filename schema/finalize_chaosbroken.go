//go:build chaosbroken

package schema

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// FinalizeSplit is a deliberately broken finalize, built only with the
// chaosbroken tag for the chaos harness's own test: it marks the claimed
// rows done in one transaction and writes the reply in a second, calling
// between after the first commit. A worker that dies there leaves done rows
// without a reply, which the harness must report.
func FinalizeSplit(ctx context.Context, db Beginner, f Finalize, between func()) (Finalized, error) {
	var out Finalized
	var err error
	if _, out.MessageID, err = TurnIDs(ctx, db, f.ConversationID, f.OutboxIDs, f.Generation); err != nil {
		return out, err
	}
	if _, err := db.Exec(ctx, `
		UPDATE agent_outbox SET status = 'done', processed_at = now()
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, f.OutboxIDs, f.RunID); err != nil {
		return out, err
	}
	between()
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO messages (id, conversation_id, role, content, run_id, turn_id)
			VALUES ($1, $2, 'assistant', $3, $4, $5)`, out.MessageID, f.ConversationID, f.Content, f.RunID, f.TurnID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE conversations SET run_id = NULL, lease_expires_at = NULL WHERE id = $1 AND run_id = $2`, f.ConversationID, f.RunID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE operations SET message_id = $1 WHERE run_id = $2 AND message_id IS NULL`, out.MessageID, f.RunID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			UPDATE agent_runs SET status = 'finalized', reply_message_id = $2, finished_at = clock_timestamp()
			WHERE id = $1`, f.RunID, out.MessageID)
		return err
	})
	return out, err
}
