-- +goose Up
-- Stop and regenerate. A user may stop the turn that runs: the stop is
-- committed here first (every wait lives in PostgreSQL), then the worker
-- that holds the turn is told; it ends the turn with the partial reply,
-- marked stopped. A worker that misses the notice sees the stop when it
-- renews its lease or finalizes, and recovery of a dead worker's run that
-- was asked to stop settles it as stopped instead of retrying it. Messages
-- that waited for a turn when the stop came are settled at once, never
-- answered later.
--
-- A user may also have the newest reply written again: its rows go back to
-- pending with one more generation, so that the new turn has an identity
-- (and a reply id) of its own, and the old reply is kept, marked
-- superseded.

-- The run that was asked to stop while it held the conversation. It is on
-- the conversation row, which every claim, renewal, finalize and recovery
-- of the run locks or updates: each of them reads it as the stop left it.
-- Only the run it names is stopped; a later run never matches it.
-- A run that a stop ended is finalized like any run that wrote its reply;
-- the reply says it was stopped.
ALTER TABLE conversations ADD COLUMN stop_run_id TEXT;

-- generation: how many times the row was put back to be answered again
-- (regenerate); a turn's identity and its reply's id include it.
-- stopped_at: a stop settled the row (done) while it waited for a turn; no
-- turn answers it.
ALTER TABLE agent_outbox
  ADD COLUMN generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
  ADD COLUMN stopped_at TIMESTAMPTZ;

-- stopped: the reply is what the run had written when a stop ended it.
-- superseded_at: a regenerated reply replaced this one; it is kept.
ALTER TABLE messages
  ADD COLUMN stopped BOOLEAN NOT NULL DEFAULT false,
  ADD COLUMN superseded_at TIMESTAMPTZ;

-- Two migrations may each need columns of one table for one role: this
-- one (the chat history reads the tool calls of replies) and the approvals
-- migration after it (which inserts its own decision on operations for
-- the API). A decision inserted where one of the same table, role and
-- privilege exists extends it, with the union of their columns (all of
-- them when either says all), instead of failing on the primary key; in
-- whatever order the two migrations ran, the API gets both.
-- +goose StatementBegin
CREATE FUNCTION baton_grants_extend() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE public.baton_grants g
  SET columns = CASE WHEN g.columns IS NULL OR NEW.columns IS NULL THEN NULL
                     ELSE ARRAY(SELECT DISTINCT c FROM unnest(g.columns OPERATOR(pg_catalog.||) NEW.columns) c ORDER BY c) END,
      reason = g.reason OPERATOR(pg_catalog.||) '; ' OPERATOR(pg_catalog.||) NEW.reason
  WHERE g.object = NEW.object AND g.role = NEW.role AND g.privilege = NEW.privilege;
  IF FOUND THEN
    RETURN NULL;
  END IF;
  RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER baton_grants_extend BEFORE INSERT ON baton_grants
  FOR EACH ROW EXECUTE FUNCTION baton_grants_extend();

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('baton_grants_extend', 'baton_migrator', 'NONE', NULL, 'the trigger of baton_grants; a trigger needs no EXECUTE to fire'),
  ('agent_runs', 'baton_api', 'SELECT', '{id,status,reply_message_id,outbox_ids}',
   'the chat adapter finds the reply of a run, and the reply id of a running turn'),
  ('messages', 'baton_api', 'UPDATE', '{superseded_at}', 'RegenerateTx marks the replaced reply superseded'),
  ('operations', 'baton_api', 'SELECT', '{id,run_id,message_id,tool_call_id,tool,arguments,status,result}',
   'the chat history shows the tool calls of each reply');

UPDATE baton_grants SET columns = columns || '{generation,stopped_at}'
WHERE object = 'agent_outbox' AND role = 'baton_api' AND privilege = 'UPDATE' AND NOT columns @> '{generation}';
UPDATE baton_grants SET columns = columns || '{not_before,stop_run_id}'
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'UPDATE' AND NOT columns @> '{stop_run_id}';
UPDATE baton_grants SET columns = columns || '{stopped}'
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT' AND NOT columns @> '{stopped}';

SELECT baton_apply_grants();

-- +goose Down
DROP TRIGGER baton_grants_extend ON baton_grants;
DROP FUNCTION baton_grants_extend();
DELETE FROM baton_grants WHERE (object, role, privilege) IN (
  ('baton_grants_extend', 'baton_migrator', 'NONE'),
  ('agent_runs', 'baton_api', 'SELECT'),
  ('messages', 'baton_api', 'UPDATE'),
  ('operations', 'baton_api', 'SELECT'));
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'generation'), 'stopped_at')
WHERE object = 'agent_outbox' AND role = 'baton_api' AND privilege = 'UPDATE';
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'not_before'), 'stop_run_id')
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'UPDATE';
UPDATE baton_grants SET columns = array_remove(columns, 'stopped')
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT';
ALTER TABLE messages DROP COLUMN superseded_at, DROP COLUMN stopped;
ALTER TABLE agent_outbox DROP COLUMN stopped_at, DROP COLUMN generation;
ALTER TABLE conversations DROP COLUMN stop_run_id;
SELECT baton_apply_grants();
