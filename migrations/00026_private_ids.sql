-- +goose Up
-- Ids and cursors that say nothing of other conversations. A turn's id
-- and its reply's id were hashes of the global outbox ids alone, and the
-- cursors of the message lists the global seq: anyone could count the
-- messages of the whole server. From here on:
--
--   id_salt: a random secret of each conversation, never shown. The turn
--   and reply ids of new turns are hashed with it (baton_turn_id,
--   baton_reply_id), and the API encrypts a conversation's cursors (a
--   message's seq, an event's position) under a key derived from it.
--   Existing conversations get one too (the column's volatile default
--   gives every row its own).
--
--   salted_ids: set on every outbox row inserted from now on (the
--   column's default; the rows already there keep NULL). A turn's ids are
--   salted when its oldest row is: a turn claimed before this migration,
--   and so every redelivery or re-claim of it, keeps the ids it had (the
--   same hashes, without the salt), so that its reply is still written
--   once under the id its streams were told (DESIGN.md, invariant 4).
ALTER TABLE conversations
  ADD COLUMN id_salt BYTEA NOT NULL DEFAULT (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));
ALTER TABLE agent_outbox ADD COLUMN salted_ids BOOLEAN;
ALTER TABLE agent_outbox ALTER COLUMN salted_ids SET DEFAULT true;

-- The salt of the ids of a turn whose oldest row is first_row: the
-- conversation's, or none for a row older than this migration (and for a
-- row that is gone: only a pruned turn's, whose ids nobody asks for).
-- +goose StatementBegin
CREATE FUNCTION baton_id_salt(conversation_key text, first_row bigint) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce((
    SELECT CASE WHEN o.salted_ids THEN c.id_salt END
    FROM public.agent_outbox o JOIN public.conversations c ON c.id = o.conversation_id
    WHERE o.id = first_row AND o.conversation_id = conversation_key), ''::bytea)
$$;
-- +goose StatementEnd

-- A turn's id: its rows (sorted, comma-separated) and generation, hashed
-- with its salt (schema.TurnIDOf without one).
-- +goose StatementBegin
CREATE FUNCTION baton_turn_id(conversation_key text, outbox_ids bigint[], generation integer) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT 'turn_' || left(encode(sha256(
    public.baton_id_salt(conversation_key, (SELECT min(i) FROM unnest(outbox_ids) i))
    || convert_to((SELECT string_agg(i::text, ',' ORDER BY i) FROM unnest(outbox_ids) i)
      || CASE WHEN generation > 0 THEN '#' || generation ELSE '' END, 'UTF8')), 'hex'), 32)
$$;
-- +goose StatementEnd

-- A turn's reply id: its oldest row and generation, hashed with its salt
-- (schema.ReplyID without one). A turn that a newer message supersedes is
-- answered by a turn with the same oldest row, whose reply keeps the id.
-- +goose StatementBegin
CREATE FUNCTION baton_reply_id(conversation_key text, outbox_ids bigint[], generation integer) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT 'reply_' || left(encode(sha256(
    public.baton_id_salt(conversation_key, first_row)
    || convert_to('reply:' || first_row || '#' || generation, 'UTF8')), 'hex'), 32)
  FROM (SELECT min(i) AS first_row FROM unnest(outbox_ids) i) f
$$;
-- +goose StatementEnd

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('baton_id_salt', 'baton_worker', 'EXECUTE', NULL, 'the claim and finalize derive turn and reply ids'),
  ('baton_id_salt', 'baton_api', 'EXECUTE', NULL, 'the chat adapter derives the reply id of a running or waiting turn'),
  ('baton_turn_id', 'baton_worker', 'EXECUTE', NULL, 'the claim derives the turn id'),
  ('baton_reply_id', 'baton_worker', 'EXECUTE', NULL, 'the claim and finalize derive the reply id'),
  ('baton_reply_id', 'baton_api', 'EXECUTE', NULL, 'the chat adapter derives the reply id of a running or waiting turn');
SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object IN ('baton_id_salt', 'baton_turn_id', 'baton_reply_id');
DROP FUNCTION baton_reply_id(text, bigint[], integer);
DROP FUNCTION baton_turn_id(text, bigint[], integer);
DROP FUNCTION baton_id_salt(text, bigint);
ALTER TABLE agent_outbox DROP COLUMN salted_ids;
ALTER TABLE conversations DROP COLUMN id_salt;
SELECT baton_apply_grants();
