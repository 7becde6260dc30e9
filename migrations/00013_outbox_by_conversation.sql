-- +goose NO TRANSACTION
-- +goose Up
-- The outbox rows of one conversation, newest first. Reading a
-- conversation (GET, and every event stream that opens or resumes) tells
-- its turn state from its outbox rows: whether one is processing or
-- pending, and the status of the newest. Without this index each read
-- scanned the table; a wave of reconnecting clients made that thousands of
-- scans at once. Built CONCURRENTLY, so that a busy database keeps taking
-- writes meanwhile.
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_outbox_conversation
  ON agent_outbox (conversation_id, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS agent_outbox_conversation;
