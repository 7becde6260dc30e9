-- +goose Up
-- Questions an agent asks a person mid-turn: an AG-UI interrupt, an AI
-- SDK tool approval request, an A2A task that needs input. They wait like
-- an approval of a call does (the turn stops, nothing holds the
-- conversation, the decision resumes it with the next step), but no call
-- of Baton's waits: kind 'question' has no operation. question is what the
-- agent asked (its id, reason, message, the call it is about, the JSON
-- Schema of the answer it expects); answer is the person's, checked
-- against that schema. epoch and step place the question in its turn's
-- journal of steps, so that a re-claim of the turn finds its answer.
ALTER TABLE approvals
  ALTER COLUMN operation_id DROP NOT NULL,
  ADD COLUMN kind     TEXT NOT NULL DEFAULT 'call' CHECK (kind IN ('call', 'question')),
  ADD COLUMN epoch    INTEGER,
  ADD COLUMN step     INTEGER,
  ADD COLUMN question JSONB,
  ADD COLUMN answer   JSONB,
  ADD CONSTRAINT approvals_kind_fields CHECK (
    (kind = 'call' AND operation_id IS NOT NULL) OR
    (kind = 'question' AND question IS NOT NULL AND epoch IS NOT NULL AND step IS NOT NULL));

CREATE INDEX approvals_turn_questions ON approvals (conversation_id, turn_id, epoch, step) WHERE kind = 'question';

UPDATE baton_grants SET columns = columns || '{answer}'
WHERE object = 'approvals' AND role = 'baton_api' AND privilege = 'UPDATE' AND NOT columns @> '{answer}';

SELECT baton_apply_grants();

-- +goose Down
UPDATE baton_grants SET columns = array_remove(columns, 'answer')
WHERE object = 'approvals' AND role = 'baton_api' AND privilege = 'UPDATE';
DELETE FROM approvals WHERE kind = 'question';
DROP INDEX approvals_turn_questions;
ALTER TABLE approvals
  DROP CONSTRAINT approvals_kind_fields,
  DROP COLUMN answer,
  DROP COLUMN question,
  DROP COLUMN step,
  DROP COLUMN epoch,
  DROP COLUMN kind,
  ALTER COLUMN operation_id SET NOT NULL;
SELECT baton_apply_grants();
