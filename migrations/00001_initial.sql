-- +goose Up
-- The data model of the reference "Outboxes before agents": conversations,
-- their messages, and the outbox of triggers that a user message commits
-- with. Users and hashed API tokens own conversations.

CREATE TABLE users (
  id         BIGSERIAL PRIMARY KEY,
  name       TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
  created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
  id           BIGSERIAL PRIMARY KEY,
  user_id      BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  -- SHA-256 of the token; the token itself is shown once and never stored.
  token_hash   BYTEA NOT NULL UNIQUE,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  revoked_at   TIMESTAMPTZ
);

CREATE TABLE conversations (
  id               TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
  owner_id         BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  title            TEXT NOT NULL DEFAULT '',
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  -- Ordering and unread metadata, touched by the producer and by finalize.
  updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  last_message_at  TIMESTAMPTZ,
  unread_count     INTEGER NOT NULL DEFAULT 0,
  -- The run that owns the conversation, and until when. A claim takes it
  -- only when it is free; finalize commits only while it still owns it.
  run_id           TEXT,
  lease_expires_at TIMESTAMPTZ,
  CHECK ((run_id IS NULL) = (lease_expires_at IS NULL))
);

CREATE INDEX conversations_owner ON conversations (owner_id, updated_at DESC);
CREATE INDEX conversations_leased ON conversations (lease_expires_at) WHERE run_id IS NOT NULL;

CREATE TABLE messages (
  id              TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  -- 'error' is the visible outcome of a turn that gave up.
  role            TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'error')),
  content         TEXT NOT NULL,
  -- For replies and errors: the run and logical turn that produced them.
  run_id          TEXT,
  turn_id         TEXT,
  seq             BIGSERIAL NOT NULL,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX messages_conversation ON messages (conversation_id, seq);

CREATE TABLE agent_outbox (
  id              BIGSERIAL PRIMARY KEY,
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  message_id      TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
  status          TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'processing', 'done', 'error')),
  attempts        INTEGER NOT NULL DEFAULT 0,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  processed_at    TIMESTAMPTZ,
  -- The run that claimed the row last.
  run_id          TEXT,
  -- When the row was last announced again (recovery, sweeper); the sweeper
  -- looks at rows nobody claimed since.
  announced_at    TIMESTAMPTZ,
  UNIQUE (message_id)
);

CREATE INDEX agent_outbox_pending
  ON agent_outbox (conversation_id, created_at)
  WHERE status = 'pending';

-- Every attempt at a turn. Ownership of operations, and the record from which
-- overlapping runs of one conversation would show.
CREATE TABLE agent_runs (
  id               TEXT PRIMARY KEY,
  conversation_id  TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn_id          TEXT NOT NULL,
  outbox_ids       BIGINT[] NOT NULL,
  worker           TEXT NOT NULL,
  status           TEXT NOT NULL DEFAULT 'running'
                   CHECK (status IN ('running', 'finalized', 'failed', 'cancelled', 'abandoned', 'recovered')),
  error            TEXT,
  reply_message_id TEXT,
  started_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  lease_expires_at TIMESTAMPTZ NOT NULL,
  finished_at      TIMESTAMPTZ
);

CREATE INDEX agent_runs_conversation ON agent_runs (conversation_id, started_at);

-- Tool calls, journaled before and after they run, so recovery knows whether
-- an interrupted attempt had side effects.
CREATE TABLE operations (
  id              BIGSERIAL PRIMARY KEY,
  run_id          TEXT NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
  conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  tool_call_id    TEXT NOT NULL,
  tool            TEXT NOT NULL,
  tool_version    TEXT NOT NULL DEFAULT '1',
  effect          TEXT NOT NULL CHECK (effect IN ('read', 'write')),
  status          TEXT NOT NULL DEFAULT 'started'
                  CHECK (status IN ('started', 'completed', 'failed')),
  idempotency_key TEXT,
  arguments       JSONB NOT NULL DEFAULT '{}',
  result          TEXT,
  error           TEXT,
  -- The reply this operation is attached to, set by finalize.
  message_id      TEXT REFERENCES messages(id) ON DELETE CASCADE,
  started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  finished_at     TIMESTAMPTZ,
  UNIQUE (run_id, tool_call_id)
);

CREATE INDEX operations_unattached ON operations (run_id) WHERE message_id IS NULL;

-- Rows written by the built-in side-effecting test tool: one per execution,
-- with no unique key, so that a repeated side effect can be counted.
CREATE TABLE tool_side_effects (
  id              BIGSERIAL PRIMARY KEY,
  operation_id    BIGINT NOT NULL,
  idempotency_key TEXT NOT NULL,
  conversation_id TEXT NOT NULL,
  payload         TEXT NOT NULL,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE tool_side_effects;
DROP TABLE operations;
DROP TABLE agent_runs;
DROP TABLE agent_outbox;
DROP TABLE messages;
DROP TABLE conversations;
DROP TABLE api_tokens;
DROP TABLE users;
