-- +goose Up
-- A model server that asks to wait (429 or 503 with Retry-After) sets the
-- earliest time the conversation's next attempt may start: the turn goes
-- back to pending rather than holding its lease while it waits.
ALTER TABLE conversations ADD COLUMN not_before TIMESTAMPTZ;
-- A reply that the model cut off (it ran out of output tokens) is stored
-- as it is, and marked.
ALTER TABLE messages ADD COLUMN truncated BOOLEAN NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE messages DROP COLUMN truncated;
ALTER TABLE conversations DROP COLUMN not_before;
