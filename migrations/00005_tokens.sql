-- +goose Up
-- Token lifecycle: a token may expire, is revoked by setting revoked_at
-- (never deleted, so a listing shows what happened), and records when it
-- was last used. public_id is a short random name for the token, part of
-- the token text itself ("baton_<public_id>_<secret>") so that the owner
-- can tell which listed token they hold; it reveals nothing of the secret.
-- Tokens created before this migration have no public id.
ALTER TABLE api_tokens
  ADD COLUMN public_id    TEXT UNIQUE CHECK (public_id ~ '^[A-Za-z0-9]{8}$'),
  ADD COLUMN expires_at   TIMESTAMPTZ,
  ADD COLUMN last_used_at TIMESTAMPTZ;

CREATE INDEX api_tokens_user ON api_tokens (user_id, created_at);

-- +goose Down
DROP INDEX api_tokens_user;
ALTER TABLE api_tokens
  DROP COLUMN last_used_at,
  DROP COLUMN expires_at,
  DROP COLUMN public_id;
