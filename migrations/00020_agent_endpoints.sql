-- +goose Up
-- Whether each external agent (--agent ag-ui or ai-sdk) answers, as the
-- workers see it, for `baton status`: one row per protocol and URL. A
-- worker records an endpoint at most every few seconds, and at once when
-- it starts or stops answering; several workers merge their records (each
-- time is the latest any of them saw).
--
-- Nothing here is a secret: origin is the URL's scheme, host and port, and
-- name adds the first hex digits of the SHA-256 of the URL's path and
-- query, never them (a path or a query may carry a key). last_error is a
-- short text with no header value, token or URL credential.
CREATE TABLE agent_endpoints (
  name          TEXT PRIMARY KEY,
  protocol      TEXT NOT NULL,
  origin        TEXT NOT NULL,
  -- Whether the latest step request got an answer (a stream read to its
  -- end), and since when that is so.
  reachable     BOOLEAN NOT NULL,
  since         TIMESTAMPTZ NOT NULL,
  last_ok_at    TIMESTAMPTZ,
  last_error    TEXT,
  last_error_at TIMESTAMPTZ,
  CHECK (last_ok_at IS NOT NULL OR last_error_at IS NOT NULL)
);

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('agent_endpoints', 'baton_worker', 'INSERT', NULL, 'RecordAgentReach: the first record of an endpoint'),
  ('agent_endpoints', 'baton_worker', 'UPDATE', '{reachable,since,last_ok_at,last_error,last_error_at}', 'RecordAgentReach'),
  ('agent_endpoints', 'baton_worker', 'SELECT', '{name,reachable,since,last_ok_at,last_error,last_error_at}',
   'RecordAgentReach merges its record with the row other workers wrote: ON CONFLICT (name) DO UPDATE reads the key and the columns it merges'),
  ('agent_endpoints', 'baton_status', 'SELECT', NULL, 'status lists the agents and whether they answer');

SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object = 'agent_endpoints';
DROP TABLE agent_endpoints;
SELECT baton_apply_grants();
