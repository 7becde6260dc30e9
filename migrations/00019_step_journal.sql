-- +goose Up
-- The journal of a turn's steps. The turn runner drives every agent the
-- same way: it asks for a step, journals and runs the tool calls the step
-- asks for, and asks for the next step with their results. A step that
-- asked for tools is journaled here, under its turn (not under one
-- claim's run), before any of its calls is sent; its calls' operations
-- carry the turn and the step. A re-claim of the turn (a worker died, an
-- attempt failed) reads the journal and goes on at the first step with no
-- answer: an answered step is never asked again, and a call whose outcome
-- is journaled is never sent again.
--
-- epoch counts a user's explicit retries of the rows: a retry starts the
-- turn's steps over, while an automatic retry or a re-claim keeps them.
ALTER TABLE agent_outbox ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0);

-- steps_turn_id: the turn whose journaled steps the row belongs to, once
-- one of its steps is journaled. While the row is pending again (a failed
-- attempt, a recovered run), the next claim takes exactly that turn's
-- rows, so that the turn goes on from its journal instead of becoming
-- another turn with newer messages, whose agent could ask for a
-- journaled write again. Superseding the turn, a user's retry and a
-- regenerate clear it: the rows make a new turn.
ALTER TABLE agent_outbox ADD COLUMN steps_turn_id TEXT;

CREATE TABLE agent_steps (
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn_id         TEXT NOT NULL,
  epoch           INTEGER NOT NULL CHECK (epoch >= 0),
  step            INTEGER NOT NULL CHECK (step >= 0),
  -- The run that got the answer; pruned with it.
  run_id          TEXT NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
  -- The agent's answer: its text, its tool calls (their ids as the turn
  -- runner gave them), whether it was cut off, the requests it took.
  answer          JSONB NOT NULL,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (conversation_id, turn_id, epoch, step)
);

CREATE INDEX agent_steps_run ON agent_steps (run_id);

-- An operation's turn, epoch and step: the turn's operations, whichever
-- run started them. Operations of runs from before the journal have none,
-- and recovery treats their writes as it always did.
ALTER TABLE operations
  ADD COLUMN turn_id TEXT,
  ADD COLUMN epoch   INTEGER,
  ADD COLUMN step    INTEGER;

CREATE UNIQUE INDEX operations_turn_call ON operations (conversation_id, turn_id, epoch, tool_call_id)
  WHERE turn_id IS NOT NULL;
CREATE INDEX operations_turn ON operations (conversation_id, turn_id, epoch) WHERE turn_id IS NOT NULL;

-- unknown: the call was sent and no outcome came back (a transport
-- error, a timeout, a lost answer): a write in this state may have taken
-- effect, is never sent again, and fails its turn visibly.
ALTER TABLE operations DROP CONSTRAINT operations_status_check;
ALTER TABLE operations ADD CONSTRAINT operations_status_check
  CHECK (status IN ('started', 'completed', 'failed', 'unknown', 'awaiting_approval', 'denied'));

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('agent_steps', 'baton_worker', 'SELECT', NULL, 'LoadSteps: a re-claimed turn goes on from its journal'),
  ('agent_steps', 'baton_worker', 'INSERT', NULL, 'RecordStepTx'),
  ('users', 'baton_worker', 'SELECT', '{id,name}', 'the claim names the conversation''s owner, whom a step''s token is for');

-- RetryFailedTx starts the turn's steps over; RegenerateTx too.
UPDATE baton_grants SET columns = columns || '{epoch,steps_turn_id}'
WHERE object = 'agent_outbox' AND role = 'baton_api' AND privilege = 'UPDATE' AND NOT columns @> '{epoch}';
-- RecordStepTx marks the turn's rows; SupersedeTx clears them.
UPDATE baton_grants SET columns = columns || '{steps_turn_id}'
WHERE object = 'agent_outbox' AND role = 'baton_worker' AND privilege = 'UPDATE' AND NOT columns @> '{steps_turn_id}';

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object = 'agent_steps';
DELETE FROM baton_grants WHERE object = 'users' AND role = 'baton_worker';
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'epoch'), 'steps_turn_id')
WHERE object = 'agent_outbox' AND role IN ('baton_api', 'baton_worker') AND privilege = 'UPDATE';
UPDATE operations SET status = 'failed' WHERE status = 'unknown';
ALTER TABLE operations DROP CONSTRAINT operations_status_check;
ALTER TABLE operations ADD CONSTRAINT operations_status_check
  CHECK (status IN ('started', 'completed', 'failed', 'awaiting_approval', 'denied'));
DROP INDEX operations_turn;
DROP INDEX operations_turn_call;
ALTER TABLE operations DROP COLUMN step, DROP COLUMN epoch, DROP COLUMN turn_id;
DROP TABLE agent_steps;
ALTER TABLE agent_outbox DROP COLUMN steps_turn_id, DROP COLUMN epoch;
SELECT baton_apply_grants();
