-- +goose Up
-- A user's retry or regenerate of a turn that made writes is refused
-- unless the user says to repeat them: the API reads which of a turn's
-- operations were writes, and nothing else more of operations.
INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('operations', 'baton_api', 'SELECT', '{effect}', 'RetryFailedTx and RegenerateTx name the writes a turn made');
SELECT baton_apply_grants();

-- +goose Down
UPDATE baton_grants
SET columns = array_remove(columns, 'effect'),
    reason = replace(reason, '; RetryFailedTx and RegenerateTx name the writes a turn made', '')
WHERE object = 'operations' AND role = 'baton_api' AND privilege = 'SELECT';
SELECT baton_apply_grants();
