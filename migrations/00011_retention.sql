-- +goose NO TRANSACTION
-- +goose Up
-- Retention (README, "Retention"): the relay that holds the slot prunes, in
-- small batches, what no invariant needs any more: done and failed outbox
-- rows, finished runs, operations of runs that produced no reply, and group
-- inbox rows of events the stream no longer holds. Messages, and with them
-- a conversation's visible history, are never pruned.
--
-- The indexes let each batch find its oldest rows without reading the
-- table. They are built CONCURRENTLY, so that a database that has run for
-- months keeps taking writes while they build: this migration runs outside
-- a transaction, and every statement can run again after an interruption.

-- Which stream a group inbox row's stream_seq counts in: the pruner
-- compares it with that stream's first sequence. Rows recorded before this
-- column existed have none, and count as the relay's outbox stream's (the
-- only one the built-in groups read).
ALTER TABLE group_inbox ADD COLUMN IF NOT EXISTS stream TEXT;

-- How a parked event was resolved: applied (a replay or a retry applied
-- it) or discarded (`baton group dead-letters discard`, which keeps the
-- row). And when the stream had stored it, so that a retry hands the
-- handler the event as it was delivered.
ALTER TABLE group_dead_letters
  ADD COLUMN IF NOT EXISTS resolution TEXT CHECK (resolution IN ('applied', 'discarded')),
  ADD COLUMN IF NOT EXISTS published_at TIMESTAMPTZ;

-- An index build that was interrupted leaves an invalid index behind,
-- which IF NOT EXISTS would keep: drop it, so that it is built again.
-- +goose StatementBegin
DO $$
DECLARE
  i record;
BEGIN
  FOR i IN
    SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
    WHERE NOT x.indisvalid AND c.relname IN
      ('agent_outbox_finished', 'agent_runs_finished', 'operations_unattached_id', 'group_inbox_processed')
  LOOP
    EXECUTE format('DROP INDEX %I', i.relname);
  END LOOP;
END
$$;
-- +goose StatementEnd

-- Done and failed rows, by the time they were finished.
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_outbox_finished
  ON agent_outbox ((coalesce(processed_at, created_at)), id)
  WHERE status IN ('done', 'error');

-- Runs that ended, by the time they ended.
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_runs_finished
  ON agent_runs ((coalesce(finished_at, started_at)), id)
  WHERE status <> 'running';

-- Operations attached to no message, oldest first (ids grow with time).
CREATE INDEX CONCURRENTLY IF NOT EXISTS operations_unattached_id
  ON operations (id)
  WHERE message_id IS NULL;

-- Inbox rows by the time they were applied.
CREATE INDEX CONCURRENTLY IF NOT EXISTS group_inbox_processed
  ON group_inbox (processed_at);

-- The relay prunes (schema.Prune): it reads and deletes the rows the rules
-- select, and reads which conversation a run leases. `baton status` reads
-- the size and the oldest row of each table (schema.TableStats). Groups
-- record the stream of an inbox row, and resolve or discard dead letters.
INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('agent_outbox', 'baton_relay', 'DELETE', NULL, 'Prune: done and error rows past the outbox retention'),
  ('agent_runs', 'baton_relay', 'SELECT', NULL, 'Prune: finished runs, and the runs of operations'),
  ('agent_runs', 'baton_relay', 'DELETE', NULL, 'Prune: finished runs past the runs retention, with no operation left'),
  ('operations', 'baton_relay', 'SELECT', NULL, 'Prune: operations attached to no message'),
  ('operations', 'baton_relay', 'DELETE', NULL, 'Prune: operations of finished runs that produced no reply'),
  ('group_inbox', 'baton_relay', 'SELECT', NULL, 'Prune: inbox rows of events the stream no longer holds'),
  ('group_inbox', 'baton_relay', 'DELETE', NULL, 'Prune: inbox rows of events the stream no longer holds'),
  ('conversations', 'baton_relay', 'SELECT', '{id,run_id}', 'Prune: a run that holds a lease is never pruned'),
  ('messages', 'baton_relay', 'SELECT', '{conversation_id,role,seq}',
   'Prune: the error rows of a conversation whose last word is a visible failure are kept'),
  ('operations', 'baton_status', 'SELECT', '{id,started_at,message_id}', 'TableStats: the oldest unattached operation'),
  ('group_inbox', 'baton_status', 'SELECT', '{processed_at}', 'TableStats: the oldest inbox row'),
  ('audit_events', 'baton_status', 'SELECT', '{id,recorded_at}', 'TableStats: the oldest audit event')
ON CONFLICT (object, role, privilege) DO NOTHING;

UPDATE baton_grants SET columns = columns || '{id,processed_at}'
WHERE object = 'agent_outbox' AND role = 'baton_status' AND privilege = 'SELECT' AND NOT columns @> '{processed_at}';
UPDATE baton_grants SET columns = columns || '{status,started_at,finished_at}'
WHERE object = 'agent_runs' AND role = 'baton_status' AND privilege = 'SELECT' AND NOT columns @> '{finished_at}';
UPDATE baton_grants SET columns = columns || '{resolution,published_at}'
WHERE object = 'group_dead_letters' AND role = 'baton_group' AND privilege = 'UPDATE' AND NOT columns @> '{resolution}';

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE (object, role, privilege) IN (
  ('agent_outbox', 'baton_relay', 'DELETE'),
  ('agent_runs', 'baton_relay', 'SELECT'),
  ('agent_runs', 'baton_relay', 'DELETE'),
  ('operations', 'baton_relay', 'SELECT'),
  ('operations', 'baton_relay', 'DELETE'),
  ('group_inbox', 'baton_relay', 'SELECT'),
  ('group_inbox', 'baton_relay', 'DELETE'),
  ('conversations', 'baton_relay', 'SELECT'),
  ('messages', 'baton_relay', 'SELECT'),
  ('operations', 'baton_status', 'SELECT'),
  ('group_inbox', 'baton_status', 'SELECT'),
  ('audit_events', 'baton_status', 'SELECT'));
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'id'), 'processed_at')
WHERE object = 'agent_outbox' AND role = 'baton_status' AND privilege = 'SELECT';
UPDATE baton_grants SET columns = array_remove(array_remove(array_remove(columns, 'status'), 'started_at'), 'finished_at')
WHERE object = 'agent_runs' AND role = 'baton_status' AND privilege = 'SELECT';
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'resolution'), 'published_at')
WHERE object = 'group_dead_letters' AND role = 'baton_group' AND privilege = 'UPDATE';
DROP INDEX CONCURRENTLY IF EXISTS group_inbox_processed;
DROP INDEX CONCURRENTLY IF EXISTS operations_unattached_id;
DROP INDEX CONCURRENTLY IF EXISTS agent_runs_finished;
DROP INDEX CONCURRENTLY IF EXISTS agent_outbox_finished;
ALTER TABLE group_dead_letters DROP COLUMN IF EXISTS published_at, DROP COLUMN IF EXISTS resolution;
ALTER TABLE group_inbox DROP COLUMN IF EXISTS stream;
SELECT baton_apply_grants();
