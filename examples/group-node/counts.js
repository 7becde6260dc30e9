// The group's effect: one more event for the event's conversation, in
// event_counts (counts.sql). It runs in the transaction that records the
// event in the group's inbox, and must do all its work through db: what it
// writes commits with the inbox row or not at all. Replace it with your
// own; an effect outside PostgreSQL (an HTTP call) is at least once, so
// send ev.id along for the other side to deduplicate.
'use strict';

async function countEvent(db, ev) {
  await db.query(
    `INSERT INTO event_counts (conversation_id, events, last_event_id, last_stream_seq)
     VALUES ($1, 1, $2, $3)
     ON CONFLICT (conversation_id) DO UPDATE
     SET events = event_counts.events + 1, last_event_id = excluded.last_event_id,
         last_stream_seq = excluded.last_stream_seq, updated_at = now()`,
    [ev.trigger.conversation_id, ev.id, ev.streamSeq]
  );
}

module.exports = { countEvent };
