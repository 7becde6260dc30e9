-- +goose Up
-- Least privilege (DESIGN.md, invariant 13): each component connects to
-- PostgreSQL as a role of its own (deploy/postgres/roles.sql makes them) and
-- may use only the tables, columns and sequences its code uses. The roles
-- are made by a superuser, outside the migrations; a database migrated
-- before they exist (tests, `baton dev`, one role for everything) simply
-- grants nothing.
--
-- baton_grants is the decision, one row per table or sequence, role and
-- privilege; baton_apply_grants() makes the privileges of every role that
-- exists say exactly that (revoking what no row lists). Every table and
-- sequence of the schema has at least one row: a row of privilege NONE
-- records that only the owner, baton_migrator (the role that runs `baton
-- migrate`), uses it. A migration that adds a table or a sequence adds its
-- rows; one that adds a column a role writes adds the column to that row
-- (UPDATE baton_grants SET columns = columns || '{name}' WHERE ...); both
-- end with SELECT baton_apply_grants(). A test fails while a table or a
-- sequence has no row.
-- `baton migrate` and roles.sql apply them again after their work, so roles
-- made later, or a grant made by hand, end up as the rows say.
--
-- The roles, and what of each table their code uses:
--   baton_api      the HTTP API: users and tokens to authenticate,
--                  conversations, messages and outbox rows of its users,
--                  a user's retry of failed rows
--   baton_worker   the turn runner: claim, lease, load, finalize, fail,
--                  recover, the operations journal
--   baton_relay    reads and announces outbox rows, records its slot's
--                  progress (and streams, with the REPLICATION attribute)
--   baton_group    consumer groups and replay: inbox, dead letters, audit
--   baton_status   `baton status`: counts and leases, never content
--   baton_admin    `baton token create|list|revoke`
CREATE TABLE baton_grants (
  object    TEXT NOT NULL,
  role      TEXT NOT NULL CHECK (role ~ '^baton_[a-z]+$'),
  -- NONE: the role gets nothing, on purpose.
  privilege TEXT NOT NULL CHECK (privilege IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE', 'USAGE', 'NONE')),
  -- The columns it is limited to; NULL: all of them. A column that does not
  -- exist yet is granted once a later migration adds it (and the test of
  -- the migrations refuses one that never comes).
  columns   TEXT[],
  -- Which code needs it.
  reason    TEXT NOT NULL,
  PRIMARY KEY (object, role, privilege)
);

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('users', 'baton_api', 'SELECT', NULL, 'Authenticate reads the user of a token'),
  ('users', 'baton_api', 'UPDATE', '{created_at}',
   'CheckConversationQuotaTx locks the user row FOR UPDATE, which needs UPDATE on one column: created_at, which nothing relies on'),
  ('users', 'baton_admin', 'SELECT', NULL, 'token create and list look the user up'),
  ('users', 'baton_admin', 'INSERT', NULL, 'token create makes the user when missing'),
  ('users_id_seq', 'baton_admin', 'USAGE', NULL, 'token create makes users'),

  ('api_tokens', 'baton_api', 'SELECT', NULL, 'Authenticate, TokenActive'),
  ('api_tokens', 'baton_api', 'UPDATE', '{last_used_at}', 'Authenticate records the last use, to the minute'),
  ('api_tokens', 'baton_admin', 'SELECT', NULL, 'token list, revoke'),
  ('api_tokens', 'baton_admin', 'INSERT', NULL, 'token create'),
  ('api_tokens', 'baton_admin', 'UPDATE', '{revoked_at}', 'token revoke'),
  ('api_tokens_id_seq', 'baton_admin', 'USAGE', NULL, 'token create'),

  ('conversations', 'baton_api', 'SELECT', NULL, 'GetConversation, ListConversations, CountConversations, ConversationByKey'),
  ('conversations', 'baton_api', 'INSERT', '{id,public_id,owner_id,title}', 'CreateConversation'),
  ('conversations', 'baton_api', 'UPDATE', '{updated_at,last_message_at,unread_count,retry_window_started_at,retries_in_window}',
   'InsertMessageTx touches the conversation, MarkRead, RetryFailedTx counts retries; the locks of both'),
  ('conversations', 'baton_api', 'DELETE', NULL, 'DeleteConversation; its rows cascade as the tables'' owner'),
  ('conversations', 'baton_worker', 'SELECT', NULL, 'ClaimTx, StartOperationTx, recovery'),
  ('conversations', 'baton_worker', 'UPDATE', '{run_id,lease_expires_at,updated_at,last_message_at,unread_count,not_before}',
   'ClaimTx, RenewLease, FinalizeTx, FailAttemptTx, recovery: the lease, a wait the model asked for, the metadata of a reply'),
  ('conversations', 'baton_status', 'SELECT', '{id,run_id,lease_expires_at}', 'status counts and lists leases'),

  ('messages', 'baton_api', 'SELECT', NULL, 'ListMessages, a retried message'),
  ('messages', 'baton_api', 'INSERT', '{id,public_id,owner_id,conversation_id,role,content}', 'InsertMessageTx writes user messages'),
  ('messages', 'baton_worker', 'SELECT', NULL, 'LoadTurn, history'),
  ('messages', 'baton_worker', 'INSERT', '{id,conversation_id,role,content,truncated,detail,run_id,turn_id}',
   'FinalizeTx writes the reply, FailAttemptTx the visible error'),
  ('messages_seq_seq', 'baton_api', 'USAGE', NULL, 'messages.seq of a user message'),
  ('messages_seq_seq', 'baton_worker', 'USAGE', NULL, 'messages.seq of a reply or an error'),

  ('agent_outbox', 'baton_api', 'SELECT', NULL, 'turn_state, ListMessages, AnnounceTx'),
  ('agent_outbox', 'baton_api', 'INSERT', '{conversation_id,message_id}', 'InsertMessageTx writes the outbox row'),
  ('agent_outbox', 'baton_api', 'UPDATE', '{status,attempts,processed_at,run_id,announced_at}', 'RetryFailedTx puts failed rows back to pending'),
  ('agent_outbox', 'baton_worker', 'SELECT', NULL, 'ClaimTx, LoadTurn, AnnounceTx, recovery'),
  ('agent_outbox', 'baton_worker', 'UPDATE', '{status,attempts,run_id,processed_at}', 'ClaimTx, FinalizeTx, FailAttemptTx, recovery'),
  ('agent_outbox', 'baton_relay', 'SELECT', NULL, 'AnnounceTx'),
  ('agent_outbox', 'baton_relay', 'UPDATE', '{announced_at}', 'AnnounceStaleTx (the sweeper), AnnouncePendingTx (a new slot)'),
  ('agent_outbox', 'baton_status', 'SELECT', '{status,created_at}', 'status counts rows by status and the oldest pending row'),
  ('agent_outbox_id_seq', 'baton_api', 'USAGE', NULL, 'agent_outbox.id'),

  ('agent_runs', 'baton_worker', 'SELECT', NULL, 'recovery reads the run'),
  ('agent_runs', 'baton_worker', 'INSERT', NULL, 'ClaimTx records the run'),
  ('agent_runs', 'baton_worker', 'UPDATE', '{status,error,reply_message_id,finished_at,lease_expires_at}',
   'RenewLease, FinalizeTx, FailAttemptTx, MarkRun, recovery'),
  ('agent_runs', 'baton_status', 'SELECT', '{id,worker}', 'status names the worker of a lease'),

  ('operations', 'baton_worker', 'SELECT', NULL, 'recovery and FailAttemptTx look for started writes'),
  ('operations', 'baton_worker', 'INSERT', NULL, 'StartOperationTx'),
  ('operations', 'baton_worker', 'UPDATE', '{status,result,error,finished_at,message_id}',
   'CompleteOperation, FailOperation; finalize attaches them to the reply'),
  ('operations_id_seq', 'baton_worker', 'USAGE', NULL, 'operations.id'),

  ('tool_side_effects', 'baton_worker', 'INSERT', NULL, 'RecordSideEffect (the echo agent''s notify tool)'),
  ('tool_side_effects_id_seq', 'baton_worker', 'USAGE', NULL, 'tool_side_effects.id'),

  ('group_inbox', 'baton_group', 'SELECT', NULL, 'GroupApplied, CountGroupApplied (replay), Park'),
  ('group_inbox', 'baton_group', 'INSERT', NULL, 'RecordGroupEventTx'),
  ('group_dead_letters', 'baton_group', 'SELECT', NULL, 'DeadLetters, Park'),
  ('group_dead_letters', 'baton_group', 'INSERT', NULL, 'Park'),
  ('group_dead_letters', 'baton_group', 'UPDATE', '{stream,stream_seq,attempts,error,parked,parked_at,resolved_at}',
   'Park again, ResolveDeadLetterTx'),
  ('group_dead_letters', 'baton_status', 'SELECT', '{group_name,stream_seq,parked_at,resolved_at}', 'status counts parked events'),
  ('group_dead_letters_id_seq', 'baton_group', 'USAGE', NULL, 'group_dead_letters.id'),
  ('audit_events', 'baton_group', 'INSERT', NULL, 'AppendAuditTx; the table refuses updates and deletes'),
  ('audit_events_id_seq', 'baton_group', 'USAGE', NULL, 'audit_events.id'),

  ('goose_db_version', 'baton_migrator', 'NONE', NULL, 'the migrations'' own record: `baton migrate` only'),
  ('goose_db_version_id_seq', 'baton_migrator', 'NONE', NULL, 'the migrations'' own record: `baton migrate` only'),
  ('baton_grants', 'baton_migrator', 'NONE', NULL, 'the grant decisions: the migrations only');

-- The slot's progress records come with migration 00006, where it exists.
INSERT INTO baton_grants (object, role, privilege, columns, reason)
SELECT v.* FROM (VALUES
  ('relay_slot_progress', 'baton_relay', 'SELECT', NULL::text[], 'RecordSlotProgress at each heartbeat'),
  ('relay_slot_progress', 'baton_relay', 'INSERT', NULL, 'RecordSlotProgress'),
  ('relay_slot_progress', 'baton_relay', 'UPDATE', '{confirmed_lsn,progressed_at,observed_at}', 'RecordSlotProgress'),
  ('relay_slot_progress', 'baton_status', 'SELECT', NULL, 'ReadSlotProgress: since when the slot stood still')
) AS v(object, role, privilege, columns, reason)
WHERE to_regclass('relay_slot_progress') IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION baton_apply_grants() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE c.oid = 'baton_grants'::regclass);
  o record;
  r record;
  g record;
  kind text;
  cols text;
  applied integer := 0;
BEGIN
  -- Two runs at once (two `baton migrate`, roles.sql) would change the
  -- same catalog rows: one waits for the other.
  PERFORM pg_advisory_xact_lock(hashtext('baton_apply_grants'));
  -- Every table and sequence of the schema, for every role named in
  -- baton_grants that exists (a database migrated without the roles grants
  -- nothing) and does not own it: what the role held is revoked, then what
  -- the rows give is granted, so the rows are the whole truth and a table
  -- without rows gives nothing to anyone. It is one transaction: no session
  -- sees the moment in between.
  FOR o IN
    SELECT c.oid, c.relname, c.relkind, c.relowner FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = schema_name AND c.relkind IN ('r', 'p', 'S')
    ORDER BY c.relname
  LOOP
    kind := CASE WHEN o.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END;
    FOR r IN
      SELECT pr.rolname FROM pg_roles pr
      WHERE pr.rolname IN (SELECT role FROM baton_grants) AND pr.oid <> o.relowner
      ORDER BY pr.rolname
    LOOP
      EXECUTE format('REVOKE ALL ON %s %I.%I FROM %I', kind, schema_name, o.relname, r.rolname);
      FOR g IN
        SELECT privilege, columns FROM baton_grants
        WHERE object = o.relname AND role = r.rolname AND privilege <> 'NONE'
        ORDER BY privilege
      LOOP
        cols := '';
        IF g.columns IS NOT NULL THEN
          SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
          FROM pg_attribute a
          WHERE a.attrelid = o.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY (g.columns);
          IF cols IS NULL THEN
            CONTINUE; -- none of its columns exists yet
          END IF;
          cols := ' (' || cols || ')';
        END IF;
        EXECUTE format('GRANT %s%s ON %s %I.%I TO %I', g.privilege, cols, kind, schema_name, o.relname, r.rolname);
        applied := applied + 1;
      END LOOP;
    END LOOP;
  END LOOP;
  RETURN applied;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION baton_apply_grants() FROM PUBLIC;

SELECT baton_apply_grants();

-- +goose Down
DROP FUNCTION baton_apply_grants();
DROP TABLE baton_grants;
