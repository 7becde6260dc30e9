-- +goose Up
-- The publication of outbox inserts that the relay reads, made by the
-- schema's owner with the schema: a relay then needs no right to create
-- it (it only checks it and says what to run when it is missing).
-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'baton_outbox') THEN
    CREATE PUBLICATION baton_outbox FOR TABLE agent_outbox WITH (publish = 'insert');
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'baton_outbox') THEN
    DROP PUBLICATION baton_outbox;
  END IF;
END
$$;
-- +goose StatementEnd
