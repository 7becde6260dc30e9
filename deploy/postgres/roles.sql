-- Baton's PostgreSQL roles, one per component, and what each may do in
-- Baton's database (DESIGN.md, invariant 13). Run it as a superuser, before
-- `baton migrate` and again whenever you like: it creates what is missing,
-- sets the passwords it is given and the grants anew, and prints no
-- password.
--
--   psql -d postgres -v migrator_password=... -v api_password=... \
--        -v worker_password=... -v relay_password=... -v group_password=... \
--        -f deploy/postgres/roles.sql
--
-- A password left out of -v is read from the environment instead (psql 15
-- or later), where the process list does not show it:
-- BATON_PG_MIGRATOR_PASSWORD, BATON_PG_API_PASSWORD, and so on. A password
-- may also be given as a SCRAM verifier (SCRAM-SHA-256$4096:...), which
-- PostgreSQL stores as it is.
--
-- Optional:
--   -v status_password=...  makes baton_status, for `baton status`
--   -v admin_password=...   makes baton_admin, for `baton token`
--   -v console_password=... makes baton_console, for `baton console`
--   -v database=NAME        Baton's database, made when missing (baton)
--
-- The roles:
--   baton_migrator  runs `baton migrate`: owns the tables, sequences and
--                   the publication (it may create in the database and its
--                   public schema; nobody else may)
--   baton_api       `baton api`
--   baton_worker    `baton worker`
--   baton_relay     `baton relay`: REPLICATION, for its slot and its
--                   logical replication connection
--   baton_group     `baton group run`, `baton replay`
--   baton_status    `baton status`: reads counts, never content; member of
--                   pg_read_all_stats, to see the relay's connection
--   baton_admin     `baton token create|list|revoke`
--   baton_console   `baton console`, the operator console: reads what it
--                   shows, writes only through the operator's paths
--                   (retries, recorded outcomes, dead letters, sessions,
--                   operator_actions); member of pg_read_all_stats, to see
--                   the relay's connection, as baton_status
--   baton_producer  a group role, never a login: your backend's own role,
--                   made a member (GRANT baton_producer TO shop), may call
--                   the SQL producer's functions, baton_create_conversation
--                   and baton_send_message, in its own transactions, and
--                   nothing else of Baton's (docs/guides/producing.md)
-- What each may do with each table and function is decided in migrations
-- 00007 and 00015 (baton_grants); this file applies it to the roles it
-- made.

\set ON_ERROR_STOP on
\set QUIET on
\set ECHO none
-- An error says what was wrong, never the statement that carried it.
\set VERBOSITY terse

-- Nothing of this session may reach the server's log with a password in
-- it, whatever the server logs otherwise.
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
SET log_min_duration_statement = -1;
SET log_error_verbosity = 'terse';

\if :{?migrator_password}
\else
\getenv migrator_password BATON_PG_MIGRATOR_PASSWORD
\endif
\if :{?api_password}
\else
\getenv api_password BATON_PG_API_PASSWORD
\endif
\if :{?worker_password}
\else
\getenv worker_password BATON_PG_WORKER_PASSWORD
\endif
\if :{?relay_password}
\else
\getenv relay_password BATON_PG_RELAY_PASSWORD
\endif
\if :{?group_password}
\else
\getenv group_password BATON_PG_GROUP_PASSWORD
\endif
\if :{?status_password}
\else
\getenv status_password BATON_PG_STATUS_PASSWORD
\endif
\if :{?admin_password}
\else
\getenv admin_password BATON_PG_ADMIN_PASSWORD
\endif
\if :{?console_password}
\else
\getenv console_password BATON_PG_CONSOLE_PASSWORD
\endif

-- The passwords go to the server as settings of this session (SELECT
-- statements, which log_statement = 'ddl' or 'mod' never logs), and the
-- block below reads them there: no statement text holds one.
\if :{?migrator_password}
SELECT set_config('baton.password_migrator', :'migrator_password', false) IS NULL AS unused \gset
\endif
\if :{?api_password}
SELECT set_config('baton.password_api', :'api_password', false) IS NULL AS unused \gset
\endif
\if :{?worker_password}
SELECT set_config('baton.password_worker', :'worker_password', false) IS NULL AS unused \gset
\endif
\if :{?relay_password}
SELECT set_config('baton.password_relay', :'relay_password', false) IS NULL AS unused \gset
\endif
\if :{?group_password}
SELECT set_config('baton.password_group', :'group_password', false) IS NULL AS unused \gset
\endif
\if :{?status_password}
SELECT set_config('baton.password_status', :'status_password', false) IS NULL AS unused \gset
\endif
\if :{?admin_password}
SELECT set_config('baton.password_admin', :'admin_password', false) IS NULL AS unused \gset
\endif
\if :{?console_password}
SELECT set_config('baton.password_console', :'console_password', false) IS NULL AS unused \gset
\endif

DO $$
DECLARE
  r record;
  m record;
  pw text;
BEGIN
  -- Two runs at once would change the same roles: one waits.
  PERFORM pg_advisory_xact_lock(hashtext('baton roles.sql'));
  FOR r IN SELECT * FROM (VALUES
      ('migrator', true, 'NOREPLICATION'),
      ('api', true, 'NOREPLICATION'),
      ('worker', true, 'NOREPLICATION'),
      ('relay', true, 'REPLICATION'),
      ('group', true, 'NOREPLICATION'),
      ('status', false, 'NOREPLICATION'),
      ('admin', false, 'NOREPLICATION'),
      ('console', false, 'NOREPLICATION')) AS v(component, required, replication)
  LOOP
    pw := coalesce(current_setting('baton.password_' || r.component, true), '');
    IF pw = '' THEN
      IF r.required THEN
        RAISE EXCEPTION 'roles.sql: no password for baton_%: give -v %_password=... or set BATON_PG_%_PASSWORD (a random one: openssl rand -base64 24)',
          r.component, r.component, upper(r.component);
      END IF;
      CONTINUE;
    END IF;
    IF length(pw) < 16 THEN
      RAISE EXCEPTION 'roles.sql: the password for baton_% is shorter than 16 characters: use a random one (openssl rand -base64 24)', r.component;
    END IF;
    BEGIN
      EXECUTE format('CREATE ROLE %I', 'baton_' || r.component);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL; -- it exists (or another run made it a moment ago)
    END;
    -- Every attribute is set, also those a role already had: a role that
    -- someone gave more is put back to what its component needs.
    EXECUTE format('ALTER ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS INHERIT %s PASSWORD %L',
      'baton_' || r.component, r.replication, pw);
  END LOOP;
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'baton_status') THEN
    GRANT pg_read_all_stats TO baton_status;
  END IF;
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'baton_console') THEN
    GRANT pg_read_all_stats TO baton_console;
  END IF;
  -- The producers' group role: no login and no password of its own, and a
  -- member of no other role, so that what its members get from it is the
  -- producer's functions and nothing more.
  BEGIN
    CREATE ROLE baton_producer;
  EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
  END;
  ALTER ROLE baton_producer WITH NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS INHERIT NOREPLICATION PASSWORD NULL;
  FOR m IN SELECT a.roleid::regrole AS granted FROM pg_auth_members a WHERE a.member = 'baton_producer'::regrole LOOP
    EXECUTE format('REVOKE %s FROM baton_producer', m.granted);
  END LOOP;
END
$$;

\if :{?database}
\else
\set database baton
\endif
SELECT NOT EXISTS (SELECT FROM pg_database WHERE datname = :'database') AS create_database \gset
\if :create_database
CREATE DATABASE :"database";
\endif
-- A new session, in Baton's database: the one above and its settings end.
\connect :"database"
SET log_statement = 'none';
SET log_min_error_statement = 'panic';

-- Only Baton's roles may connect, and only the migrator may create
-- anything: no role gets temporary tables or a schema of its own.
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- CREATE on the database: migration 00008 makes the publication.
GRANT CREATE ON DATABASE :"database" TO baton_migrator;
GRANT USAGE, CREATE ON SCHEMA public TO baton_migrator;

DO $$
DECLARE
  role_name name;
  f regprocedure;
BEGIN
  -- baton_producer's members connect through it.
  FOR role_name IN SELECT rolname FROM pg_roles WHERE rolname IN
      ('baton_migrator', 'baton_api', 'baton_worker', 'baton_relay', 'baton_group', 'baton_status', 'baton_admin', 'baton_console', 'baton_producer')
  LOOP
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), role_name);
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', role_name);
  END LOOP;
  -- Announcements and heartbeats reach the relay as logical decoding
  -- messages, which any role could write by default: only the roles whose
  -- code writes them may (AnnounceTx: api, worker, relay, and the console's
  -- retries; the heartbeat: relay). The function's signature differs
  -- between PostgreSQL versions.
  FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO baton_api, baton_worker, baton_relay', f);
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'baton_console') THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO baton_console', f);
    END IF;
  END LOOP;
END
$$;

-- The grants of each table and function, as baton_grants decides them,
-- once the migrations ran (before, `baton migrate` applies them itself).
SELECT to_regproc('baton_apply_grants') IS NOT NULL AS migrated \gset
\if :migrated
SELECT baton_apply_grants() AS grants \gset
\echo roles.sql: the roles are ready, with :grants table, sequence and function grants in database :database
\else
\echo roles.sql: the roles are ready; database :database is not migrated yet: run baton migrate as baton_migrator
\endif
