-- +goose Up
-- Consumer groups: every durable consumer of the outbox stream besides the
-- turn runner records each event it applied in its inbox, in the same
-- transaction as its own effects, so a redelivery or a replay never applies
-- an event twice. The event ID is the event's Nats-Msg-Id (see
-- consumer.Event for why not the stream sequence).
CREATE TABLE group_inbox (
  group_name   TEXT NOT NULL,
  event_id     TEXT NOT NULL,
  -- Where the event was when it was applied; a dry-run replay counts
  -- applied events by it.
  stream_seq   BIGINT NOT NULL,
  outbox_id    BIGINT,
  processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (group_name, event_id)
);

CREATE INDEX group_inbox_seq ON group_inbox (group_name, stream_seq);

-- Events a group gave up on after its attempt cap, with the last error:
-- parked visibly, never dropped. A replay delivers them again; applying one
-- then sets resolved_at.
CREATE TABLE group_dead_letters (
  id          BIGSERIAL PRIMARY KEY,
  group_name  TEXT NOT NULL,
  event_id    TEXT NOT NULL,
  stream      TEXT NOT NULL,
  stream_seq  BIGINT NOT NULL,
  subject     TEXT NOT NULL,
  outbox_id   BIGINT,
  headers     JSONB NOT NULL DEFAULT '{}',
  payload     BYTEA NOT NULL,
  attempts    INTEGER NOT NULL,
  error       TEXT NOT NULL,
  -- How often the event was parked: more than once after replays that
  -- failed again.
  parked      INTEGER NOT NULL DEFAULT 1,
  parked_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  resolved_at TIMESTAMPTZ,
  UNIQUE (group_name, event_id)
);

CREATE INDEX group_dead_letters_open ON group_dead_letters (group_name, parked_at) WHERE resolved_at IS NULL;

-- The built-in audit group's log: one row per outbox event, never changed
-- or removed. It has no foreign keys, so it outlives deleted conversations.
CREATE TABLE audit_events (
  id              BIGSERIAL PRIMARY KEY,
  group_name      TEXT NOT NULL,
  event_id        TEXT NOT NULL,
  stream_seq      BIGINT NOT NULL,
  subject         TEXT NOT NULL,
  outbox_id       BIGINT NOT NULL,
  conversation_id TEXT NOT NULL,
  message_id      TEXT NOT NULL,
  reason          TEXT NOT NULL,
  outbox_created_at TIMESTAMPTZ NOT NULL,
  published_at    TIMESTAMPTZ NOT NULL,
  recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX audit_events_conversation ON audit_events (conversation_id, id);

-- Append-only: updates, deletes and truncation fail for every role, the
-- owner included (REVOKE alone would not bind the owner or a superuser's
-- application role). Dropping the table (the down migration) still works.
-- +goose StatementBegin
CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_events is append-only: % is not allowed', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER audit_events_no_update_delete
  BEFORE UPDATE OR DELETE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();

CREATE TRIGGER audit_events_no_truncate
  BEFORE TRUNCATE ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();

-- +goose Down
DROP TABLE audit_events;
DROP FUNCTION audit_events_append_only();
DROP TABLE group_dead_letters;
DROP TABLE group_inbox;
