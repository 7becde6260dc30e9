-- +goose NO TRANSACTION
-- +goose Up
-- What the operator console reads, found through an index at any size (a
-- million conversations, ten million messages): no page counts or scans a
-- whole table. Built CONCURRENTLY, so that a busy database keeps taking
-- writes meanwhile; every statement can run again after an interruption.

-- An interrupted build leaves an invalid index, which IF NOT EXISTS would
-- keep: drop it, so that it is built again.
-- +goose StatementBegin
DO $$
DECLARE
  i record;
BEGIN
  FOR i IN
    SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
    WHERE NOT x.indisvalid AND c.relname IN
      ('conversations_public_id', 'agent_runs_running', 'agent_outbox_failed', 'group_dead_letters_retry')
  LOOP
    EXECUTE format('DROP INDEX %I', i.relname);
  END LOOP;
END
$$;
-- +goose StatementEnd

-- A conversation found by the id its client chose, whoever owns it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS conversations_public_id ON conversations (public_id);

-- Turns running now, for the overview.
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_runs_running ON agent_runs (started_at) WHERE status = 'running';

-- Failed rows, newest first: the failed turns.
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_outbox_failed ON agent_outbox (processed_at, id) WHERE status = 'error';

-- Dead letters an operator marked for retry, which their group applies.
CREATE INDEX CONCURRENTLY IF NOT EXISTS group_dead_letters_retry
  ON group_dead_letters (group_name, id) WHERE retry_requested_at IS NOT NULL AND resolved_at IS NULL;

-- The overview reads the last hour of ended runs through agent_runs_finished.
-- A partial index gives the planner no statistics of its expression: it
-- would guess that a third of the runs ended within the hour and read the
-- whole table. These statistics tell it how few did.
CREATE STATISTICS IF NOT EXISTS agent_runs_ended_at ON (coalesce(finished_at, started_at)) FROM agent_runs;
ANALYZE agent_runs;

-- +goose Down
DROP STATISTICS IF EXISTS agent_runs_ended_at;
DROP INDEX CONCURRENTLY IF EXISTS group_dead_letters_retry;
DROP INDEX CONCURRENTLY IF EXISTS agent_outbox_failed;
DROP INDEX CONCURRENTLY IF EXISTS agent_runs_running;
DROP INDEX CONCURRENTLY IF EXISTS conversations_public_id;
