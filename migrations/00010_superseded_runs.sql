-- +goose Up
-- A run whose reply would have answered only part of a burst is handed
-- back (superseded) when a newer message of its conversation arrives
-- before it commits, unless it started a write: the next turn answers
-- them all.
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
  CHECK (status IN ('running', 'finalized', 'failed', 'cancelled', 'abandoned', 'recovered', 'superseded'));

-- +goose Down
UPDATE agent_runs SET status = 'recovered' WHERE status = 'superseded';
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
  CHECK (status IN ('running', 'finalized', 'failed', 'cancelled', 'abandoned', 'recovered'));
