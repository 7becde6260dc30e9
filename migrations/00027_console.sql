-- +goose Up
-- The operator console (`baton console`), a process of its own with a role
-- of its own, baton_console: it reads what it shows and writes only through
-- the operator's paths below.

-- An operator token (`baton token create --admin` or `--viewer`) signs in
-- to the console and nowhere else: the API refuses it like an unknown
-- token. admin acts (retry, record an outcome, discard or retry a dead
-- letter); viewer reads. NULL: a user's token, which the console refuses.
ALTER TABLE api_tokens
  ADD COLUMN operator_role TEXT CHECK (operator_role IN ('admin', 'viewer'));

-- A signed-in operator's session. The cookie holds a random secret; only
-- its SHA-256 is stored here, so reading this table signs nobody in. A
-- session ends at sign-out (ended_at), when it has been idle for the
-- console's idle timeout (last_seen_at, recorded to the minute), at its
-- absolute expiry (expires_at, never later than the JWT it was made from),
-- and when the token it was made from is revoked or expires: every request
-- reads the token with the session.
CREATE TABLE console_sessions (
  id           BIGSERIAL PRIMARY KEY,
  secret_hash  BYTEA NOT NULL UNIQUE,
  operator     TEXT NOT NULL CHECK (length(operator) BETWEEN 1 AND 512),
  role         TEXT NOT NULL CHECK (role IN ('admin', 'viewer')),
  -- The operator token the session was made from; NULL for a JWT.
  token_id     BIGINT REFERENCES api_tokens(id) ON DELETE CASCADE,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  expires_at   TIMESTAMPTZ NOT NULL,
  ended_at     TIMESTAMPTZ
);

CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- Every operator action and every view of a conversation's content: who,
-- when, what. Pruned with the other tables (schema.Retention).
CREATE TABLE operator_actions (
  id       BIGSERIAL PRIMARY KEY,
  at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  operator TEXT NOT NULL,
  role     TEXT NOT NULL,
  -- sign_in, sign_out, view_conversation, retry_turn, resume_turn,
  -- record_outcome, discard_dead_letter, retry_dead_letter.
  action   TEXT NOT NULL,
  -- What it was done to: a conversation's key, an operation, a group's
  -- dead letter.
  target   TEXT NOT NULL DEFAULT '',
  detail   TEXT NOT NULL DEFAULT ''
);

CREATE INDEX operator_actions_at ON operator_actions (at);

-- A dead letter an operator marked for retry in the console. The console
-- only marks it: the group's own process, which has the handler, applies
-- it (consumer/group), and clears the mark whatever the outcome.
ALTER TABLE group_dead_letters
  ADD COLUMN retry_requested_at TIMESTAMPTZ,
  ADD COLUMN retry_requested_by TEXT;

-- Who recorded the outcome of a write whose outcome was unknown ("it was
-- done", with its result, or "it was not done"): the turn then goes on
-- from its journal with that outcome, never sending the call again.
ALTER TABLE operations ADD COLUMN outcome_recorded_by TEXT;

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('users', 'baton_console', 'SELECT', '{id,name}', 'sign-in names the operator of a token; conversations are found by their user'),
  ('api_tokens', 'baton_console', 'SELECT', '{id,user_id,token_hash,operator_role,revoked_at,expires_at,last_used_at}',
   'AuthenticateOperator, and every request checks its session''s token'),
  ('api_tokens', 'baton_console', 'UPDATE', '{last_used_at}', 'AuthenticateOperator records the last use, to the minute'),
  ('console_sessions', 'baton_console', 'SELECT', NULL, 'every request reads its session'),
  ('console_sessions', 'baton_console', 'INSERT', NULL, 'sign-in'),
  ('console_sessions', 'baton_console', 'UPDATE', '{last_seen_at,ended_at}', 'the idle timeout, sign-out'),
  ('console_sessions', 'baton_console', 'DELETE', NULL, 'PruneConsoleSessions: sessions that ended'),
  ('console_sessions_id_seq', 'baton_console', 'USAGE', NULL, 'console_sessions.id'),
  ('operator_actions', 'baton_console', 'SELECT', NULL, 'the console lists the operators'' actions'),
  ('operator_actions', 'baton_console', 'INSERT', NULL, 'RecordOperatorActionTx'),
  ('operator_actions_id_seq', 'baton_console', 'USAGE', NULL, 'operator_actions.id'),
  ('operator_actions', 'baton_relay', 'SELECT', '{id,at}', 'Prune: actions past the retention'),
  ('operator_actions', 'baton_relay', 'DELETE', NULL, 'Prune: actions past the retention'),
  ('operator_actions', 'baton_status', 'SELECT', '{id,at}', 'TableStats: the oldest operator action'),
  ('conversations', 'baton_console', 'SELECT', NULL, 'conversations, leases, stuck turns'),
  ('conversations', 'baton_console', 'UPDATE', '{retry_window_started_at,retries_in_window}',
   'RetryFailedTx counts the retry (and locks the row)'),
  ('messages', 'baton_console', 'SELECT', NULL, 'a conversation''s messages'),
  ('agent_outbox', 'baton_console', 'SELECT', NULL, 'turns, failed and stuck rows, AnnounceTx'),
  ('agent_outbox', 'baton_console', 'UPDATE', '{status,attempts,processed_at,run_id,announced_at,epoch,steps_turn_id}',
   'RetryFailedTx (the user''s retry) and ResumeTurnTx put failed rows back to pending'),
  ('agent_runs', 'baton_console', 'SELECT', NULL, 'turns and their attempts, the overview''s charts'),
  ('operations', 'baton_console', 'SELECT', NULL, 'the journal: tool calls with their effect, key and outcome'),
  ('operations', 'baton_console', 'UPDATE', '{status,result,error,finished_at,outcome_recorded_by}',
   'RecordOutcomeTx: the operator says what became of a write whose outcome was unknown'),
  ('agent_steps', 'baton_console', 'SELECT', NULL, 'the journal of steps'),
  ('approvals', 'baton_console', 'SELECT', NULL, 'approvals and questions, and those that wait too long'),
  ('group_dead_letters', 'baton_console', 'SELECT', NULL, 'dead letters'),
  ('group_dead_letters', 'baton_console', 'UPDATE', '{resolved_at,resolution,retry_requested_at,retry_requested_by}',
   'DiscardDeadLetterTx, RequestDeadLetterRetryTx'),
  ('group_inbox', 'baton_console', 'INSERT', NULL, 'DiscardDeadLetterTx records the event as applied, so no replay brings it back'),
  ('group_inbox', 'baton_console', 'SELECT', '{group_name,event_id}', 'DiscardDeadLetterTx: ON CONFLICT (group_name, event_id) reads the key'),
  ('relay_slot_progress', 'baton_console', 'SELECT', NULL, 'the overview''s relay: since when the slot stood still'),
  ('agent_endpoints', 'baton_console', 'SELECT', NULL, 'the overview lists the external agents'),
  ('mcp_servers', 'baton_console', 'SELECT', NULL, 'the overview lists the MCP servers'),
  ('mcp_tools', 'baton_console', 'SELECT', NULL, 'the overview lists the MCP tools');

-- A group applies the retries asked for, and clears the mark whatever
-- came of it (Park again, ResolveDeadLetterTx).
UPDATE baton_grants SET columns = columns || '{retry_requested_at,retry_requested_by}'
WHERE object = 'group_dead_letters' AND role = 'baton_group' AND privilege = 'UPDATE' AND NOT columns @> '{retry_requested_at}';

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE role = 'baton_console';
DELETE FROM baton_grants WHERE object IN ('console_sessions', 'console_sessions_id_seq', 'operator_actions', 'operator_actions_id_seq');
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'retry_requested_at'), 'retry_requested_by')
WHERE object = 'group_dead_letters' AND role = 'baton_group' AND privilege = 'UPDATE';
ALTER TABLE group_dead_letters DROP COLUMN retry_requested_by, DROP COLUMN retry_requested_at;
ALTER TABLE operations DROP COLUMN outcome_recorded_by;
DROP TABLE operator_actions;
DROP TABLE console_sessions;
ALTER TABLE api_tokens DROP COLUMN operator_role;
SELECT baton_apply_grants();
