-- +goose Up
-- A chat stream whose turn stops for a person's approval shows the text
-- the turn's steps said before it, as the journal holds it: the live
-- deltas that carried it are previews, and some may have been lost.
INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('agent_steps', 'baton_api', 'SELECT', NULL, 'WaitingApproval: the text a turn said before it stopped for an approval');

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object = 'agent_steps' AND role = 'baton_api';
SELECT baton_apply_grants();
