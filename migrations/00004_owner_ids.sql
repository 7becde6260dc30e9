-- +goose Up
-- Ids that clients choose are unique per owner, not globally: two users may
-- both have conversation "demo" and message "m1". The client's id becomes
-- public_id; id stays the key every table, NATS subject, events stream and
-- deduplication id uses, and for new rows the server chooses it. Existing
-- rows keep their id as their key and get it as their public id too.

ALTER TABLE conversations ADD COLUMN public_id TEXT;
UPDATE conversations SET public_id = id;
ALTER TABLE conversations
  ALTER COLUMN public_id SET NOT NULL,
  ADD CONSTRAINT conversations_public_id_length CHECK (length(public_id) BETWEEN 1 AND 200),
  -- A user's retries of failed turns are limited per hour.
  ADD COLUMN retry_window_started_at TIMESTAMPTZ,
  ADD COLUMN retries_in_window INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX conversations_owner_public_id ON conversations (owner_id, public_id);

-- A user message carries its owner so that its client id is unique per
-- owner; replies and errors have no public id (their id is the server's).
ALTER TABLE messages
  ADD COLUMN public_id TEXT,
  ADD COLUMN owner_id BIGINT REFERENCES users(id) ON DELETE CASCADE,
  -- The operator's account of a failed turn (flags to check, the model
  -- server's answer); the user sees only the short content.
  ADD COLUMN detail TEXT;
UPDATE messages m SET public_id = m.id, owner_id = c.owner_id
FROM conversations c WHERE c.id = m.conversation_id AND m.role = 'user';
ALTER TABLE messages
  ADD CONSTRAINT messages_public_id_owner CHECK ((public_id IS NULL) = (owner_id IS NULL)),
  ADD CONSTRAINT messages_public_id_length CHECK (public_id IS NULL OR length(public_id) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX messages_owner_public_id ON messages (owner_id, public_id) WHERE public_id IS NOT NULL;

-- +goose Down
DROP INDEX messages_owner_public_id;
ALTER TABLE messages
  DROP CONSTRAINT messages_public_id_length,
  DROP CONSTRAINT messages_public_id_owner,
  DROP COLUMN detail,
  DROP COLUMN owner_id,
  DROP COLUMN public_id;
DROP INDEX conversations_owner_public_id;
ALTER TABLE conversations
  DROP COLUMN retries_in_window,
  DROP COLUMN retry_window_started_at,
  DROP CONSTRAINT conversations_public_id_length,
  DROP COLUMN public_id;
