-- +goose Up
-- reasoning: what the model thought before it answered, as the agent
-- showed it (the built-in model's reasoning_content, an external agent's
-- reasoning events), kept with the reply and shown apart from its text.
-- NULL when the agent showed none. It is never sent back to a model.
ALTER TABLE messages ADD COLUMN reasoning TEXT;

-- Finalize writes it with the reply.
UPDATE baton_grants SET columns = columns || '{reasoning}'
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT' AND NOT columns @> '{reasoning}';

SELECT baton_apply_grants();

-- +goose Down
UPDATE baton_grants SET columns = array_remove(columns, 'reasoning')
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT';
ALTER TABLE messages DROP COLUMN reasoning;
SELECT baton_apply_grants();
