-- +goose Up
-- Tools served by MCP servers, and approvals of side-effecting calls.
--
-- mcp_tools: each tool an MCP server lists, with the SHA-256 of its
-- definition (name, title, description, schemas, annotations). The first
-- definition a worker sees is accepted; a definition that changes after
-- that is disabled on every worker until an operator accepts it (`baton
-- mcp accept`), since a changed description or annotation can change what
-- the model does with it and what Baton may assume about its effect.
CREATE TABLE mcp_tools (
  server              TEXT NOT NULL,
  tool                TEXT NOT NULL,
  accepted_sha256     TEXT NOT NULL,
  accepted_definition JSONB NOT NULL,
  accepted_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
  -- What the server listed last, when it differs from the accepted one.
  listed_sha256       TEXT NOT NULL,
  listed_definition   JSONB NOT NULL,
  -- The effect the listing worker derived (trust, annotations, overrides).
  effect              TEXT NOT NULL CHECK (effect IN ('read', 'write')),
  listed_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (server, tool)
);

-- An MCP server's listing, for `baton status`: when a worker last listed
-- it, and what went wrong if it could not.
CREATE TABLE mcp_servers (
  server     TEXT PRIMARY KEY,
  listed_at  TIMESTAMPTZ,
  error      TEXT,
  error_at   TIMESTAMPTZ
);

-- What an operation carries about what it sent: the SHA-256 of its
-- arguments (checked again before an approved call leaves) and of the
-- tool's definition when it was called.
ALTER TABLE operations
  ADD COLUMN arguments_sha256 TEXT,
  ADD COLUMN definition_sha256 TEXT;
-- awaiting_approval: journaled, not sent, waiting for a person; denied:
-- never sent (denied, or its approval expired).
ALTER TABLE operations DROP CONSTRAINT operations_status_check;
ALTER TABLE operations ADD CONSTRAINT operations_status_check
  CHECK (status IN ('started', 'completed', 'failed', 'awaiting_approval', 'denied'));

-- A run that stopped to wait for an approval: it holds nothing any more.
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
  CHECK (status IN ('running', 'finalized', 'failed', 'cancelled', 'abandoned', 'recovered', 'superseded', 'waiting_for_approval'));

-- One side-effecting call waiting for, or given, a person's decision. The
-- turn that asked stopped; its rows are pending and its conversation free.
-- The conversation's approval_id names the approval its next claim must
-- resume from, until that turn ends (reply or visible error).
CREATE TABLE approvals (
  id                BIGSERIAL PRIMARY KEY,
  -- What the API shows: no client chooses it.
  public_id         TEXT NOT NULL UNIQUE,
  conversation_id   TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  run_id            TEXT NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
  operation_id      BIGINT NOT NULL REFERENCES operations(id) ON DELETE CASCADE,
  turn_id           TEXT NOT NULL,
  outbox_ids        BIGINT[] NOT NULL,
  tool              TEXT NOT NULL,
  arguments         JSONB NOT NULL,
  arguments_sha256  TEXT NOT NULL,
  definition_sha256 TEXT NOT NULL,
  -- The agent's state at the call (the turn's model steps and tool
  -- results so far): the turn resumes from it without asking the model
  -- again.
  state             JSONB NOT NULL,
  status            TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
  created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
  expires_at        TIMESTAMPTZ NOT NULL,
  decided_at        TIMESTAMPTZ,
  decided_by        BIGINT
);

CREATE INDEX approvals_conversation ON approvals (conversation_id, id);
CREATE INDEX approvals_pending ON approvals (expires_at) WHERE status = 'pending';

ALTER TABLE conversations ADD COLUMN approval_id BIGINT REFERENCES approvals(id) ON DELETE SET NULL;

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('mcp_tools', 'baton_worker', 'SELECT', NULL, 'ListMCPTools reads the accepted definitions when a turn starts'),
  ('mcp_tools', 'baton_worker', 'INSERT', NULL, 'RecordMCPListing accepts a first definition'),
  ('mcp_tools', 'baton_worker', 'UPDATE', '{listed_sha256,listed_definition,effect,listed_at}', 'RecordMCPListing'),
  ('mcp_tools', 'baton_admin', 'SELECT', NULL, 'baton mcp accept'),
  ('mcp_tools', 'baton_admin', 'UPDATE', '{accepted_sha256,accepted_definition,accepted_at}', 'baton mcp accept'),
  ('mcp_tools', 'baton_status', 'SELECT', NULL, 'status lists the tools, their effects and changes'),
  ('mcp_servers', 'baton_worker', 'SELECT', NULL, 'RecordMCPListing'),
  ('mcp_servers', 'baton_worker', 'INSERT', NULL, 'RecordMCPListing'),
  ('mcp_servers', 'baton_worker', 'UPDATE', '{listed_at,error,error_at}', 'RecordMCPListing'),
  ('mcp_servers', 'baton_status', 'SELECT', NULL, 'status lists the servers'),
  ('approvals', 'baton_worker', 'SELECT', NULL, 'claim resumes a decided approval'),
  ('approvals', 'baton_worker', 'INSERT', NULL, 'ParkTx'),
  ('approvals', 'baton_worker', 'UPDATE', '{status,decided_at}', 'a claim expires an approval past its time'),
  ('approvals_id_seq', 'baton_worker', 'USAGE', NULL, 'approvals.id'),
  ('approvals', 'baton_api', 'SELECT', NULL, 'ListApprovals, DecideApprovalTx'),
  ('approvals', 'baton_api', 'UPDATE', '{status,decided_at,decided_by}', 'DecideApprovalTx'),
  ('operations', 'baton_api', 'SELECT', '{id,conversation_id,status,arguments,tool_call_id}',
   'DecideApprovalTx checks the stored arguments; approvals show the call''s id; the chat history finds the approval of a call'),
  ('operations', 'baton_api', 'UPDATE', '{status,error,finished_at}', 'DecideApprovalTx records a denied call'),
  ('approvals', 'baton_relay', 'SELECT', '{conversation_id,status,expires_at}',
   'AnnounceStaleTx leaves out conversations that wait for an approval'),
  ('approvals', 'baton_status', 'SELECT', '{status,created_at}', 'status counts approvals waiting');

UPDATE baton_grants SET columns = columns || '{approval_id}'
WHERE object = 'conversations' AND role = 'baton_worker' AND privilege = 'UPDATE';
-- StartApprovedOperationTx: the resumed run takes the approved call over.
UPDATE baton_grants SET columns = columns || '{run_id,started_at}'
WHERE object = 'operations' AND role = 'baton_worker' AND privilege = 'UPDATE';

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object IN ('mcp_tools', 'mcp_servers', 'approvals', 'approvals_id_seq');
DELETE FROM baton_grants WHERE object = 'operations' AND role = 'baton_api';
UPDATE baton_grants SET columns = array_remove(columns, 'approval_id')
WHERE object = 'conversations' AND role = 'baton_worker' AND privilege = 'UPDATE';
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'run_id'), 'started_at')
WHERE object = 'operations' AND role = 'baton_worker' AND privilege = 'UPDATE';
ALTER TABLE conversations DROP COLUMN approval_id;
DROP TABLE approvals;
UPDATE agent_runs SET status = 'abandoned' WHERE status = 'waiting_for_approval';
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
  CHECK (status IN ('running', 'finalized', 'failed', 'cancelled', 'abandoned', 'recovered', 'superseded'));
UPDATE operations SET status = 'failed' WHERE status IN ('awaiting_approval', 'denied');
ALTER TABLE operations DROP CONSTRAINT operations_status_check;
ALTER TABLE operations ADD CONSTRAINT operations_status_check
  CHECK (status IN ('started', 'completed', 'failed'));
ALTER TABLE operations DROP COLUMN definition_sha256, DROP COLUMN arguments_sha256;
DROP TABLE mcp_servers;
DROP TABLE mcp_tools;
SELECT baton_apply_grants();
