// The group's inbox and dead letters, in Baton's own tables: group_inbox
// and group_dead_letters (migrations/00003_groups.sql), keyed by the
// group's name, which the Go groups use too. An event is applied in one
// transaction with its inbox row, so a redelivery or a replay of an
// applied event finds its key taken and applies nothing; an event that
// failed for good is parked, never dropped. The statements are those of
// Baton's schema/group.go (RecordInboxTx, ResolveDeadLetterTx, Park), so
// that `baton status`, `baton group dead-letters` and the pruner see this
// group as they see a Go one.
'use strict';

// HandlerError is a failure of the group's own effect, as opposed to one
// of the machinery around it (the database away): only these count
// towards parking an event.
class HandlerError extends Error {
  constructor(cause, { permanent = false } = {}) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.permanent = permanent;
  }
}

// apply runs handler(db, ev) for ev in one transaction with the event's
// inbox row, and returns 'applied', or 'duplicate' when the inbox already
// held the event. The inbox row goes first: a second delivery of the same
// event running at the same time (an ack wait that expired while the first
// was still running) waits on its key and finds it taken once the first
// commits. A failing handler rolls everything back and is thrown as a
// HandlerError.
async function apply(pool, ev, handler) {
  const db = await pool.connect();
  let broken;
  try {
    await db.query('BEGIN');
    const fresh = await db.query(
      `INSERT INTO group_inbox (group_name, event_id, stream, stream_seq, outbox_id)
       VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (group_name, event_id) DO NOTHING`,
      [ev.group, ev.id, ev.stream, ev.streamSeq, ev.outboxID]
    );
    if (fresh.rowCount === 0) {
      await db.query('COMMIT');
      return 'duplicate';
    }
    try {
      await handler(db, ev);
    } catch (err) {
      throw new HandlerError(err);
    }
    // An event parked earlier and applied now (a replay after a fix) is
    // no longer dead.
    await db.query(
      `UPDATE group_dead_letters SET resolved_at = now(), resolution = 'applied'
       WHERE group_name = $1 AND event_id = $2 AND resolved_at IS NULL`,
      [ev.group, ev.id]
    );
    await db.query('COMMIT');
    return 'applied';
  } catch (err) {
    try {
      await db.query('ROLLBACK');
    } catch (rollbackErr) {
      // The connection is gone: it goes back to no pool.
      broken = rollbackErr;
    }
    throw err;
  } finally {
    db.release(broken);
  }
}

// park records ev in group_dead_letters with the error that ended it,
// unless the group applied it meanwhile (another process, after an ack
// wait expired). Parking an event again (a replay that fails again)
// counts it and clears its resolution.
async function park(pool, ev, cause) {
  await pool.query(
    `INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, outbox_id, headers, payload, attempts, error, published_at)
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
     WHERE NOT EXISTS (SELECT 1 FROM group_inbox WHERE group_name = $1 AND event_id = $2)
     ON CONFLICT (group_name, event_id) DO UPDATE
     SET stream = excluded.stream, stream_seq = excluded.stream_seq, attempts = excluded.attempts,
         error = excluded.error, parked = group_dead_letters.parked + 1,
         parked_at = now(), resolved_at = NULL, resolution = NULL,
         published_at = coalesce(excluded.published_at, group_dead_letters.published_at)`,
    [ev.group, ev.id, ev.stream, ev.streamSeq, ev.subject, ev.outboxID, JSON.stringify(ev.headers), ev.data,
      ev.attempt, cause.message, ev.publishedAt]
  );
}

module.exports = { apply, park, HandlerError };
