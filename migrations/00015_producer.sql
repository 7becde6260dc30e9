-- +goose Up
-- The SQL producer (docs/reference/sql-producer.md): the functions a
-- backend in any language calls inside its own transaction to create a
-- conversation and to store a user message with its outbox row, so that
-- its own state change and the message commit together or not at all.
-- The API and the Go producer (schema.InsertMessageTx,
-- schema.CreateConversation) write through the same functions: there is
-- one write path (DESIGN.md, invariant 14).
--
--   baton_create_conversation(user_id, conversation_id, title)
--   baton_send_message(user_id, conversation_id, message_id, content)
--       the stable contract, for the role baton_producer: a user by the
--       name the API knows (users.name), SECURITY DEFINER
--   baton_create_conversation_for_owner(owner_id, conversation_id, title)
--   baton_send_message_for_owner(owner_id, conversation_id, message_id, content, trace_parent)
--       the same writes for a user the caller has already found (the API,
--       which also keeps the request's trace context on the outbox row);
--       they run with the caller's own privileges
--
-- Every error raises a SQLSTATE of class PB (implementation-defined: no
-- PostgreSQL class starts with P but P0) before anything is written:
--   PB001 bad user id           PB004 empty content       PB010 unknown conversation
--   PB002 bad conversation id   PB005 content too large   PB011 conflict: the message id
--   PB003 bad message id        PB006 bad title                 was used for something else
--
-- The functions name every table with its schema, and those that run
-- statements fix their search_path to pg_catalog (and pg_temp last), so
-- no object of another schema, or a temporary one, can stand in for
-- Baton's. Baton's tables are in schema public, where
-- deploy/postgres/roles.sql lets only the migrator create anything.
-- +goose StatementBegin
DO $$
BEGIN
  IF to_regclass('conversations') IS DISTINCT FROM to_regclass('public.conversations') THEN
    RAISE EXCEPTION 'the producer functions expect Baton''s tables in schema public, not in %: migrate with a search_path that starts with public',
      (SELECT relnamespace::regnamespace FROM pg_class WHERE oid = to_regclass('conversations'));
  END IF;
END
$$;
-- +goose StatementEnd

-- A server-chosen key ("c_" for a conversation, "m_" for a message): a
-- version 7 UUID (time-ordered, so that new rows go to the right edge of
-- the primary key's index), of the form the keys had when Go chose them.
-- A plain SQL function without settings, so that PostgreSQL inlines it
-- into the statements that call it (which fix their search_path) instead
-- of parsing it again in every transaction; it names everything with its
-- schema all the same.
-- +goose StatementBegin
CREATE FUNCTION baton_new_key(prefix text) RETURNS text
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
  SELECT prefix OPERATOR(pg_catalog.||) pg_catalog.encode(
    pg_catalog.set_bit(pg_catalog.set_bit(
      pg_catalog.overlay(
        pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
        -- the first 48 bits: milliseconds since 1970
        pg_catalog.substring(pg_catalog.int8send(pg_catalog.floor(
          pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint), 3),
        1, 6),
      -- version 4 (0100) becomes 7 (0111)
      52, 1), 53, 1),
    'hex')::pg_catalog.uuid::pg_catalog.text
$$;
-- +goose StatementEnd

-- A client-chosen conversation or message id, by the rules of
-- schema.ValidateID: 1 to 200 characters, no control character, no
-- whitespace at either end (it does not survive NATS headers and is never
-- what a user meant).
-- +goose StatementBegin
CREATE FUNCTION baton_check_id(kind text, id text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  code text := CASE kind WHEN 'conversation' THEN 'PB002' ELSE 'PB003' END;
  bad text;
BEGIN
  IF id IS NULL OR id = '' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id is empty: give 1 to 200 characters', kind);
  END IF;
  IF char_length(id) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id is %s characters long: the limit is 200', kind, char_length(id));
  END IF;
  bad := substring(id FROM E'[\\u0001-\\u001f\\u007f-\\u009f]');
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id contains the control character U+%s: use printable characters only', kind, lpad(upper(to_hex(ascii(bad))), 4, '0'));
  END IF;
  IF id ~ E'^[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]'
     OR id ~ E'[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]$' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id "%s" starts or ends with whitespace: remove it', kind, id);
  END IF;
END
$$;
-- +goose StatementEnd

-- The user a producer names: users.name, which is NAME for a user made by
-- `baton token create --user NAME` and "<iss>|<sub>" for a user who signs
-- in with a JWT. A user that does not exist yet is made when make is true,
-- as a valid JWT makes one on first sight; otherwise the answer is NULL.
-- +goose StatementBegin
CREATE FUNCTION baton_producer_user(user_id text, make boolean) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  found_id bigint;
  bad text;
BEGIN
  IF user_id IS NULL OR user_id = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'PB001',
      MESSAGE = 'user id is empty: give the user''s name, NAME for a user of baton token create --user NAME or <iss>|<sub> for a user who signs in with a JWT';
  END IF;
  IF char_length(user_id) > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB001',
      MESSAGE = format('user id is %s characters long: the limit is 1000', char_length(user_id));
  END IF;
  bad := substring(user_id FROM E'[\\u0001-\\u001f\\u007f-\\u009f]');
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PB001',
      MESSAGE = format('user id contains the control character U+%s: give the user''s name exactly as Baton knows it', lpad(upper(to_hex(ascii(bad))), 4, '0'));
  END IF;
  SELECT u.id INTO found_id FROM public.users u WHERE u.name = user_id;
  IF FOUND OR NOT make THEN
    RETURN found_id;
  END IF;
  BEGIN
    INSERT INTO public.users (name) VALUES (user_id) ON CONFLICT (name) DO NOTHING RETURNING id INTO found_id;
  EXCEPTION WHEN check_violation THEN
    -- The users table's own bound on a name, whatever it is.
    RAISE EXCEPTION USING ERRCODE = 'PB001',
      MESSAGE = format('user id is %s characters long: longer than this database''s users table takes', char_length(user_id));
  END;
  IF found_id IS NULL THEN
    -- Another transaction made the same user a moment ago.
    SELECT u.id INTO found_id FROM public.users u WHERE u.name = user_id;
  END IF;
  RETURN found_id;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation_for_owner(
  p_owner_id bigint, p_conversation_id text, p_title text,
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  IF char_length(p_title) > 500 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB006',
      MESSAGE = format('title is %s characters long: the limit is 500', char_length(p_title));
  END IF;
  -- A conversation deleted between the insert that found it and the read
  -- is made anew on the next round.
  LOOP
    INSERT INTO public.conversations AS c (id, public_id, owner_id, title)
    VALUES (public.baton_new_key('c_'), p_conversation_id, p_owner_id, coalesce(p_title, ''))
    ON CONFLICT (owner_id, public_id) DO NOTHING
    RETURNING c.id INTO conversation_key;
    IF FOUND THEN
      existed := false;
      RETURN;
    END IF;
    SELECT c.id INTO conversation_key FROM public.conversations c
    WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id;
    IF FOUND THEN
      existed := true;
      RETURN;
    END IF;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- The write path of a user message (the reference's producer): the
-- conversation row is locked first and updated last, in the transaction of
-- the outbox row, so that a worker's claim, which locks that row, cannot
-- see the outbox row before the commit is visible to it (schema.ClaimTx).
-- The owner's message id is the idempotency key: the same id and content
-- again writes nothing and says it existed; the same id with other
-- content, or in another conversation, is a conflict.
-- +goose StatementBegin
CREATE FUNCTION baton_send_message_for_owner(
  p_owner_id bigint, p_conversation_id text, p_message_id text, p_content text, p_trace_parent text,
  OUT conversation_key text, OUT message_key text, OUT outbox_id bigint, OUT message_seq bigint,
  OUT message_created_at timestamptz, OUT outbox_status text, OUT existed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  stored_conversation text;
  stored_content text;
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  PERFORM public.baton_check_id('message', p_message_id);
  IF p_content IS NULL OR p_content = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'PB004', MESSAGE = 'content is empty: give the text of the message';
  END IF;
  IF octet_length(p_content) > 1048576 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB005',
      MESSAGE = format('content is %s bytes: the limit is 1048576 bytes (1 MiB)', octet_length(p_content));
  END IF;

  SELECT c.id INTO conversation_key FROM public.conversations c
  WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: create it first with baton_create_conversation (conversation ids are per user)', p_conversation_id);
  END IF;

  INSERT INTO public.messages AS m (id, public_id, owner_id, conversation_id, role, content)
  VALUES (public.baton_new_key('m_'), p_message_id, p_owner_id, conversation_key, 'user', p_content)
  ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
  RETURNING m.id, m.seq, m.created_at INTO message_key, message_seq, message_created_at;
  IF FOUND THEN
    INSERT INTO public.agent_outbox AS o (conversation_id, message_id, trace_parent)
    VALUES (conversation_key, message_key, nullif(p_trace_parent, ''))
    RETURNING o.id INTO outbox_id;
    UPDATE public.conversations SET updated_at = now(), last_message_at = now() WHERE id = conversation_key;
    outbox_status := 'pending';
    existed := false;
    RETURN;
  END IF;

  -- The owner has a message of this id: a retry, or a conflict.
  SELECT m.id, m.conversation_id, c.public_id, m.content, m.seq, m.created_at, o.id, o.status
  INTO message_key, conversation_key, stored_conversation, stored_content, message_seq, message_created_at, outbox_id, outbox_status
  FROM public.messages m JOIN public.conversations c ON c.id = m.conversation_id
  LEFT JOIN public.agent_outbox o ON o.message_id = m.id
  WHERE m.owner_id = p_owner_id AND m.public_id = p_message_id;
  IF NOT FOUND THEN
    -- Deleted with its conversation since the insert found it.
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: it was deleted', p_conversation_id);
  END IF;
  IF stored_conversation <> p_conversation_id THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used in conversation "%s": use a new id for a new message', p_message_id, stored_conversation);
  END IF;
  IF stored_content <> p_content THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used for different content: use a new id for a new message', p_message_id);
  END IF;
  existed := true;
END
$$;
-- +goose StatementEnd

-- The stable contract. SECURITY DEFINER: they run with the rights of their
-- owner, the migrator, so that baton_producer needs no right on any table.
-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation(user_id text, conversation_id text, title text DEFAULT '',
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  created record;
BEGIN
  created := public.baton_create_conversation_for_owner(public.baton_producer_user(user_id, true), conversation_id, title);
  conversation_key := created.conversation_key;
  existed := created.existed;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION baton_send_message(user_id text, conversation_id text, message_id text, content text,
  OUT message_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  sent record;
BEGIN
  -- A user Baton does not know has no conversation: the answer is PB010,
  -- and no user is made. (An assignment, not a SELECT: PostgreSQL calls the
  -- function directly rather than through a query.)
  sent := public.baton_send_message_for_owner(public.baton_producer_user(user_id, false), conversation_id, message_id, content, NULL);
  message_key := sent.message_key;
  existed := sent.existed;
END
$$;
-- +goose StatementEnd

-- Who may execute which function, decided as tables are: baton_grants
-- takes EXECUTE, and baton_apply_grants (below) applies it to functions
-- too, revoking the EXECUTE that PostgreSQL gives PUBLIC on every new
-- function.
ALTER TABLE baton_grants DROP CONSTRAINT baton_grants_privilege_check;
ALTER TABLE baton_grants ADD CONSTRAINT baton_grants_privilege_check
  CHECK (privilege IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE', 'USAGE', 'EXECUTE', 'NONE'));

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('baton_create_conversation', 'baton_producer', 'EXECUTE', NULL, 'the SQL producer: a backend''s own transaction'),
  ('baton_send_message', 'baton_producer', 'EXECUTE', NULL, 'the SQL producer: a backend''s own transaction'),
  ('baton_create_conversation_for_owner', 'baton_api', 'EXECUTE', NULL, 'CreateConversation'),
  ('baton_send_message_for_owner', 'baton_api', 'EXECUTE', NULL, 'InsertMessageTx'),
  ('baton_check_id', 'baton_api', 'EXECUTE', NULL, 'CreateConversation and InsertMessageTx check the ids'),
  ('baton_new_key', 'baton_api', 'EXECUTE', NULL, 'CreateConversation and InsertMessageTx choose the keys'),
  ('baton_producer_user', 'baton_migrator', 'NONE', NULL, 'called only by the SQL producer''s functions, as their owner'),
  ('baton_apply_grants', 'baton_migrator', 'NONE', NULL, 'the migrations and roles.sql, as the owner or a superuser'),
  ('audit_events_append_only', 'baton_migrator', 'NONE', NULL, 'the trigger of audit_events; a trigger needs no EXECUTE to fire');

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION baton_apply_grants() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE c.oid = 'baton_grants'::regclass);
  o record;
  r record;
  g record;
  f record;
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
  -- Every function of the schema (an extension's aside): PUBLIC's
  -- EXECUTE, which PostgreSQL gives on every new function, is revoked, and
  -- each role may execute what an EXECUTE row gives it and nothing else.
  FOR f IN
    SELECT p.oid::regprocedure AS signature, p.proname, p.proowner FROM pg_proc p
    WHERE p.pronamespace = schema_name::text::regnamespace
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
    ORDER BY p.proname, p.oid
  LOOP
    EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f.signature);
    FOR r IN
      SELECT pr.rolname FROM pg_roles pr
      WHERE pr.rolname IN (SELECT role FROM baton_grants) AND pr.oid <> f.proowner
      ORDER BY pr.rolname
    LOOP
      EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %I', f.signature, r.rolname);
      IF EXISTS (SELECT FROM baton_grants WHERE object = f.proname AND role = r.rolname AND privilege = 'EXECUTE') THEN
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', f.signature, r.rolname);
        applied := applied + 1;
      END IF;
    END LOOP;
  END LOOP;
  RETURN applied;
END;
$$;
-- +goose StatementEnd

SELECT baton_apply_grants();

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION baton_apply_grants() RETURNS integer LANGUAGE plpgsql AS $$
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
  PERFORM pg_advisory_xact_lock(hashtext('baton_apply_grants'));
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
            CONTINUE;
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
DROP FUNCTION baton_send_message(text, text, text, text);
DROP FUNCTION baton_create_conversation(text, text, text);
DROP FUNCTION baton_send_message_for_owner(bigint, text, text, text, text);
DROP FUNCTION baton_create_conversation_for_owner(bigint, text, text);
DROP FUNCTION baton_producer_user(text, boolean);
DROP FUNCTION baton_check_id(text, text);
DROP FUNCTION baton_new_key(text);
DELETE FROM baton_grants WHERE privilege = 'EXECUTE'
  OR object IN ('baton_producer_user', 'baton_apply_grants', 'audit_events_append_only');
ALTER TABLE baton_grants DROP CONSTRAINT baton_grants_privilege_check;
ALTER TABLE baton_grants ADD CONSTRAINT baton_grants_privilege_check
  CHECK (privilege IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE', 'USAGE', 'NONE'));
SELECT baton_apply_grants();
