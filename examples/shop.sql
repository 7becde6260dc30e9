-- The example shop's own tables, which the producer examples write in the
-- same transaction as the message they send to Baton. Run it once, as the
-- shop's role (a member of baton_producer, with a schema of its own, see
-- docs/guides/producing.md):
--
--   psql "$DATABASE_URL" -f examples/shop.sql

CREATE TABLE IF NOT EXISTS customers (
  name text PRIMARY KEY
);
INSERT INTO customers (name) VALUES ('alice') ON CONFLICT DO NOTHING;

-- One row per support request: whose it is, the message's id and the key
-- Baton gave the message. A request from someone who is not a customer is
-- refused by the foreign key, and the whole transaction with it: the
-- message is never stored, and no worker hears of it.
CREATE TABLE IF NOT EXISTS support_requests (
  customer        text NOT NULL REFERENCES customers (name),
  message_id      text NOT NULL,
  conversation_id text NOT NULL,
  message_key     text NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (customer, message_id)
);
