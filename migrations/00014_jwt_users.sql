-- +goose Up
-- Users who sign in with a JWT of the application's own identity provider
-- are named "<iss>|<user claim>" (an issuer URL, a bar, the subject), made
-- by the API on the first valid token it sees. OpenID Connect bounds sub to
-- 255 ASCII characters and issuers are URLs of a few dozen, so the bound of
-- a user's name goes from 200 to 512 characters; a token whose name would
-- be longer is refused (401) and writes nothing.
ALTER TABLE users
  DROP CONSTRAINT users_name_check,
  ADD CONSTRAINT users_name_length CHECK (length(name) BETWEEN 1 AND 512);

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('users', 'baton_api', 'INSERT', '{name}', 'EnsureUser makes the user of a JWT on its first valid token'),
  ('users_id_seq', 'baton_api', 'USAGE', NULL, 'EnsureUser makes users')
ON CONFLICT (object, role, privilege) DO NOTHING;
SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE (object, role, privilege) IN (
  ('users', 'baton_api', 'INSERT'),
  ('users_id_seq', 'baton_api', 'USAGE'));
SELECT baton_apply_grants();
-- Names longer than 200 characters may exist by now: the old bound holds
-- for new rows only.
ALTER TABLE users
  DROP CONSTRAINT users_name_length,
  ADD CONSTRAINT users_name_check CHECK (length(name) BETWEEN 1 AND 200) NOT VALID;
