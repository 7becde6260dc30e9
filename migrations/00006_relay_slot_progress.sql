-- +goose Up
-- What the relays last saw of their replication slot. PostgreSQL keeps a
-- slot's confirmed position but not when it last moved, and `baton status`
-- runs once and leaves: to tell a slot whose position has stood still for
-- minutes from one that moved a second ago, it reads this row, which every
-- relay of the slot (streaming or standing by) updates at each heartbeat.
CREATE TABLE relay_slot_progress (
  slot_name     TEXT PRIMARY KEY,
  -- the slot's confirmed_flush_lsn when a relay last looked
  confirmed_lsn PG_LSN NOT NULL,
  -- when a relay last saw the confirmed position move, or no WAL behind it
  progressed_at TIMESTAMPTZ NOT NULL,
  -- when a relay last looked
  observed_at   TIMESTAMPTZ NOT NULL
);

-- +goose Down
DROP TABLE relay_slot_progress;
