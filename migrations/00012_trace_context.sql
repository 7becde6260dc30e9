-- +goose Up
-- The W3C trace context (traceparent) of the request that wrote an outbox
-- row, so that the relay carries it on the row's JetStream message and the
-- turn continues the caller's trace. Empty when the caller sent none and
-- tracing is off.
ALTER TABLE agent_outbox ADD COLUMN trace_parent TEXT;
UPDATE baton_grants SET columns = columns || '{trace_parent}'
WHERE object = 'agent_outbox' AND role = 'baton_api' AND privilege = 'INSERT';
SELECT baton_apply_grants();

-- +goose Down
UPDATE baton_grants SET columns = array_remove(columns, 'trace_parent')
WHERE object = 'agent_outbox' AND role = 'baton_api' AND privilege = 'INSERT';
ALTER TABLE agent_outbox DROP COLUMN trace_parent;
SELECT baton_apply_grants();
