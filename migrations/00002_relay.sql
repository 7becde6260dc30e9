-- +goose Up
-- The relay's sweeper looks for pending rows nobody claimed since their
-- insert or last announcement. This partial index holds only pending rows,
-- ordered by that time, so a sweep reads the due rows and nothing else,
-- however large the outbox grows.
CREATE INDEX agent_outbox_sweep
  ON agent_outbox ((coalesce(announced_at, created_at)), id)
  WHERE status = 'pending';

-- +goose Down
DROP INDEX agent_outbox_sweep;
