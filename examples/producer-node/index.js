// A shop's backend asks Baton's agent about a customer's support request:
// it records the request in its own table and sends the message to Baton
// in the same transaction, so both commit or neither does
// (docs/guides/producing.md).
//
//   DATABASE_URL=postgres://shop:...@db/baton node index.js start USER CONVERSATION [TITLE]
//   DATABASE_URL=postgres://shop:...@db/baton node index.js send USER CONVERSATION MESSAGE_ID TEXT
//
// TEXT "-" reads the text from standard input. USER is the user's name in
// Baton: NAME of `baton token create --user NAME`, or <iss>|<sub> of a user
// who signs in with a JWT.
'use strict';

const fs = require('node:fs');
const { Pool } = require('pg');

async function withTransaction(pool, fn) {
  const db = await pool.connect();
  try {
    await db.query('BEGIN');
    const result = await fn(db);
    await db.query('COMMIT');
    return result;
  } catch (err) {
    await db.query('ROLLBACK');
    throw err;
  } finally {
    db.release();
  }
}

// start: the conversation, made when the user has none of that id.
async function start(pool, [userId, conversationId, title = '']) {
  const { rows } = await pool.query(
    'SELECT conversation_key, existed FROM baton_create_conversation($1, $2, $3)',
    [userId, conversationId, title]
  );
  return rows[0];
}

// send: the shop's row and the message, in one transaction. A retry with
// the same message id and text changes nothing and says existed.
async function send(pool, [userId, conversationId, messageId, text]) {
  const content = text === '-' ? fs.readFileSync(0, 'utf8') : text;
  return withTransaction(pool, async (db) => {
    const { rows } = await db.query(
      'SELECT message_key, existed FROM baton_send_message($1, $2, $3, $4)',
      [userId, conversationId, messageId, content]
    );
    await db.query(
      `INSERT INTO support_requests (customer, message_id, conversation_id, message_key)
       VALUES ($1, $2, $3, $4)
       ON CONFLICT (customer, message_id) DO NOTHING`,
      [userId, messageId, conversationId, rows[0].message_key]
    );
    return rows[0];
  });
}

async function main() {
  const [command, ...args] = process.argv.slice(2);
  const commands = { start: [start, 2], send: [send, 4] };
  if (!commands[command] || args.length < commands[command][1] || !process.env.DATABASE_URL) {
    console.error('usage: DATABASE_URL=... node index.js start USER CONVERSATION [TITLE]');
    console.error('       DATABASE_URL=... node index.js send USER CONVERSATION MESSAGE_ID TEXT|-');
    process.exit(2);
  }
  const pool = new Pool({ connectionString: process.env.DATABASE_URL });
  try {
    const result = await commands[command][0](pool, args);
    console.log(JSON.stringify(result));
  } catch (err) {
    // Baton's errors carry a SQLSTATE of class PB and say what to fix.
    console.error(err.code ? `${err.code}: ${err.message}` : err.message);
    process.exitCode = 1;
  } finally {
    await pool.end();
  }
}

main();
