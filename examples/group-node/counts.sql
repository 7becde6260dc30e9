-- The example group's own table: how many outbox events of each
-- conversation it applied. Run it once, as the group's role (a member of
-- baton_group, with a schema of its own; see README.md):
--
--   psql "$BATON_DATABASE_URL" -f examples/group-node/counts.sql
--
-- The count goes up by one per event, whatever the event: it is not
-- idempotent by itself, on purpose. The group's inbox (group_inbox), in the
-- same transaction, is what keeps a redelivered or replayed event from
-- counting twice. Each message of a conversation is one event; a row that
-- recovery or the sweeper announces again is one more, with its own id.
CREATE TABLE IF NOT EXISTS event_counts (
  conversation_id text PRIMARY KEY,
  events          bigint NOT NULL,
  -- The last event counted, where it was in the stream.
  last_event_id   text NOT NULL,
  last_stream_seq bigint NOT NULL,
  updated_at      timestamptz NOT NULL DEFAULT now()
);
