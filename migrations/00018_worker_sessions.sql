-- +goose Up
-- A worker's liveness is its database session. Each worker process takes
-- a session number of its own at start (worker_session_seq) and holds a
-- session-level advisory lock on it, on a connection of its own, for as
-- long as it lives; every run it claims records the number. A process that
-- dies closes its connection, and the server releases the lock at once: a
-- run whose worker's lock is free is the run of a dead worker, taken over
-- by the next claim and recovered at once by the other workers, instead of
-- after its lease.
--
-- A server that restarted, or a standby just promoted, holds no lock at
-- all, while the live workers reconnect and take theirs again. So a free
-- lock counts only once the server has held workers' locks for a while:
-- worker_session_epochs records, per start of a server
-- (pg_postmaster_start_time(), which a promoted standby does not share
-- with the primary it replaces), when the first worker took its lock
-- there; until the grace after that has passed, the lease alone decides.
ALTER TABLE agent_runs ADD COLUMN worker_session integer;

CREATE SEQUENCE worker_session_seq AS integer CYCLE;

CREATE TABLE worker_session_epochs (
  server_started_at timestamptz PRIMARY KEY,
  first_session_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- baton_take_worker_session takes the lock of a worker's session on the
-- calling connection, without waiting: false when another session holds
-- it (this worker's previous connection, which the server has not yet
-- found gone). 1651797570 ('baton' in the lock's first key) keeps these
-- locks apart from any other advisory lock of the database.
-- +goose StatementBegin
CREATE FUNCTION baton_take_worker_session(session integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT pg_try_advisory_lock(1651797570, session) THEN
    RETURN false;
  END IF;
  INSERT INTO worker_session_epochs (server_started_at) VALUES (pg_postmaster_start_time())
  ON CONFLICT (server_started_at) DO NOTHING;
  RETURN true;
END;
$$;
-- +goose StatementEnd

-- baton_worker_sessions_trusted: whether a free lock on this server means
-- a gone worker. Workers take their locks again within moments of a
-- restart or a promotion (they retry every second at most); ten seconds
-- after the first did, one that has not is gone, or cut off.
CREATE FUNCTION baton_worker_sessions_trusted() RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (
    SELECT 1 FROM worker_session_epochs
    WHERE server_started_at = pg_postmaster_start_time()
      AND first_session_at <= now() - interval '10 seconds')
$$;

-- baton_worker_sessions_held: the sessions whose lock is held now.
CREATE FUNCTION baton_worker_sessions_held() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
  SELECT l.objid::bigint::integer FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.classid = 1651797570 AND l.objsubid = 2 AND l.granted
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
$$;

-- baton_run_session_gone: whether the run's worker is gone by its
-- session: the run records one, its lock is free, and free locks count
-- on this server. A run without a session (claimed by a worker that
-- records none) is left to its lease.
CREATE FUNCTION baton_run_session_gone(run text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT coalesce((
    SELECT r.worker_session NOT IN (SELECT baton_worker_sessions_held())
    FROM agent_runs r WHERE r.id = run AND r.worker_session IS NOT NULL), false)
    AND baton_worker_sessions_trusted()
$$;

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('worker_session_seq', 'baton_worker', 'USAGE', NULL, 'a worker numbers its session at start'),
  ('worker_session_epochs', 'baton_worker', 'SELECT', NULL, 'baton_run_session_gone: whether free locks count on this server'),
  ('worker_session_epochs', 'baton_worker', 'INSERT', NULL, 'baton_take_worker_session records the first lock taken on a server'),
  ('baton_take_worker_session', 'baton_worker', 'EXECUTE', NULL, 'TakeWorkerSession at start and after every reconnection'),
  ('baton_worker_sessions_trusted', 'baton_worker', 'EXECUTE', NULL, 'RecoverOrphanedTx, through baton_run_session_gone in the claims'),
  ('baton_worker_sessions_held', 'baton_worker', 'EXECUTE', NULL, 'RecoverOrphanedTx, through baton_run_session_gone in the claims'),
  ('baton_run_session_gone', 'baton_worker', 'EXECUTE', NULL, 'ClaimTx and ClaimTurns take over a gone worker''s conversation');
SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object IN ('worker_session_seq', 'worker_session_epochs', 'baton_take_worker_session',
  'baton_worker_sessions_trusted', 'baton_worker_sessions_held', 'baton_run_session_gone');
DROP FUNCTION baton_run_session_gone(text);
DROP FUNCTION baton_worker_sessions_held();
DROP FUNCTION baton_worker_sessions_trusted();
DROP FUNCTION baton_take_worker_session(integer);
DROP TABLE worker_session_epochs;
DROP SEQUENCE worker_session_seq;
ALTER TABLE agent_runs DROP COLUMN worker_session;
SELECT baton_apply_grants();
