// A consumer group of Baton's outbox stream, in Node: it counts the
// events of each conversation in a table of its own (counts.sql), and
// applies each event once however often it is delivered or replayed,
// because it records the event's id in Baton's group inbox in the same
// transaction as its count. README.md says how to run it.
//
//   node group.js                 run the group until SIGINT or SIGTERM
//   node group.js replay --all    go through the stream's retention again
//   node group.js replay --from-seq N | --since 1h | --at 2026-01-02T15:04:05Z
//
// Configuration is read from the environment: BATON_DATABASE_URL,
// BATON_NATS_URL, BATON_STREAM, BATON_GROUP and the rest in config.js.
'use strict';

const { parseArgs } = require('node:util');
const { Pool } = require('pg');
const { connect, credsAuthenticator, nkeyAuthenticator } = require('@nats-io/transport-node');
const { jetstream, jetstreamManager } = require('@nats-io/jetstream');

const config = require('./config');
const { logger } = require('./log');
const { validator } = require('./events');
const { apply, park, HandlerError } = require('./inbox');
const { joinStream, ensureDurable, replayStart, Refusal } = require('./stream');
const { countEvent } = require('./counts');

const usage = `usage: node group.js              run the group until SIGINT or SIGTERM
       node group.js replay --all | --from-seq N | --since DURATION | --at TIME
configuration: BATON_DATABASE_URL (required), BATON_NATS_URL, BATON_STREAM, BATON_GROUP; see README.md`;

// Exit codes: 0 after a clean stop, 1 when the group cannot run, 2 for a
// wrong command line or setting, 130 after a second signal.
class UsageError extends Error {}

// stopper turns the first SIGINT or SIGTERM into a graceful shutdown and
// the second into an exit at once.
function stopper(log) {
  let stopped = false;
  const hooks = new Set();
  const stop = {
    get stopped() {
      return stopped;
    },
    // onStop runs fn at the shutdown (at once if it began); the returned
    // function forgets it.
    onStop(fn) {
      if (stopped) {
        fn();
        return () => {};
      }
      hooks.add(fn);
      return () => hooks.delete(fn);
    },
    // sleep resolves true after ms, or false as soon as the shutdown
    // begins.
    sleep(ms) {
      return new Promise((resolve) => {
        const forget = stop.onStop(() => {
          clearTimeout(timer);
          resolve(false);
        });
        const timer = setTimeout(() => {
          forget();
          resolve(true);
        }, ms);
      });
    },
    stop() {
      if (stopped) {
        return;
      }
      stopped = true;
      for (const fn of hooks) {
        fn();
      }
      hooks.clear();
    },
  };
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.on(signal, () => {
      if (stopped) {
        log.warn('second signal, exiting at once', { signal });
        process.exit(130);
      }
      log.info('shutting down: finishing the event in hand, handing the rest back', { signal });
      stop.stop();
    });
  }
  return stop;
}

// isoMicros writes a JetStream timestamp (nanoseconds) as RFC 3339 with
// the microseconds PostgreSQL keeps.
function isoMicros(ns) {
  const ms = ns / 1_000_000n;
  const micros = String(ns / 1000n % 1_000_000n).padStart(6, '0');
  return new Date(Number(ms)).toISOString().replace(/\.\d{3}Z$/, `.${micros}Z`);
}

// Group consumes the group's durable consumer, one event at a time, and
// settles each: acked once applied, found applied (duplicate) or parked;
// handed back with a delay when it failed and will be tried again.
class Group {
  constructor({ cfg, log, pool, js, jsm, stream, validate, handler, stop }) {
    Object.assign(this, { cfg, log, pool, js, jsm, stream, validate, handler, stop });
    this.outcomes = { applied: 0, duplicate: 0, parked: 0, retry: 0 };
  }

  // run handles events until the shutdown, or until done() says the work
  // is over (a replay's end), checked every quarter second.
  async run(done) {
    const consumer = await this.js.consumers.get(this.stream.name, this.cfg.group);
    // A server heartbeat every 2 s (the client's default is 15 s), so that
    // a durable deleted under the group is noticed, and the group rejoins
    // the one it creates again, within seconds, as the Go groups do.
    const messages = await consumer.consume({ max_messages: 16, idle_heartbeat: 2000 });
    // Closing stops pulling; what was already fetched still comes out of
    // the loop below, which hands it back to the group at once.
    let ending = false;
    const end = () => {
      ending = true;
      messages.close();
    };
    const forget = this.stop.onStop(end);
    const watching = this.watch(messages);
    let check;
    if (done) {
      check = setInterval(() => {
        done().then((over) => over && end(), (err) => this.log.warn('read replay progress', { error: err }));
      }, 250);
    }
    try {
      for await (const m of messages) {
        if (ending) {
          // Not started: back to the group at once, for another process
          // or the next start.
          m.nak();
          continue;
        }
        await this.handle(m);
      }
    } finally {
      clearInterval(check);
      forget();
    }
    const err = await messages.closed();
    await watching;
    if (err && !ending) {
      throw new Error(`${this.stream.name}/${this.cfg.group} stopped receiving events: ${err.message}`);
    }
  }

  // watch rejoins a durable consumer that disappeared (deleted, or lost
  // with a stream created again empty) by creating it again. The client
  // reports the loss once per pull it had waiting: the first report
  // creates the durable, the others find it there.
  async watch(messages) {
    let failing = '';
    for await (const s of messages.status()) {
      if (s.type !== 'consumer_deleted' && s.type !== 'consumer_not_found') {
        continue;
      }
      try {
        if (await ensureDurable(this.jsm, this.cfg, this.stream, this.log)) {
          this.log.warn('durable consumer was gone; created it again and rejoined', { consumer: this.cfg.group });
        }
        failing = '';
      } catch (err) {
        if (err.message !== failing) {
          failing = err.message;
          this.log.warn('durable consumer is gone and cannot be created yet', { consumer: this.cfg.group, error: err });
        }
      }
    }
  }

  // event reads what a group knows of a delivered message. The id is the
  // event's Nats-Msg-Id ("outbox-<id>", "outbox-<id>-a<n>" for a retry
  // announcement, ...), which a replay and a republish keep; a message
  // without one is named by its place in the stream.
  event(m) {
    const info = m.info;
    const headers = m.headers ? m.headers.toRecord() : {};
    const msgID = headers['Nats-Msg-Id']?.[0];
    const outboxHeader = headers['Baton-Outbox-Id']?.[0];
    return {
      group: this.cfg.group,
      id: msgID || `${info.stream}-seq-${info.streamSequence}`,
      stream: info.stream,
      streamSeq: info.streamSequence,
      subject: m.subject,
      headers,
      data: Buffer.from(m.data),
      publishedAt: isoMicros(m.timestampNanos),
      attempt: info.deliveryCount,
      trigger: null,
      // Until the body is known good, the outbox row the headers name,
      // so that a dead letter names it.
      // (at most 18 digits: always within PostgreSQL's bigint).
      outboxID: /^[1-9][0-9]{0,17}$/.test(outboxHeader ?? '') ? outboxHeader : null,
    };
  }

  async handle(m) {
    const ev = this.event(m);
    try {
      ev.trigger = this.validate(ev.subject, ev.headers, ev.data);
      if (!Number.isSafeInteger(ev.trigger.outbox_id)) {
        // JSON numbers past 2^53 lose digits in JavaScript.
        throw new Error(`outbox_id ${ev.trigger.outbox_id} is beyond what this group reads exactly`);
      }
      ev.outboxID = ev.trigger.outbox_id;
    } catch (err) {
      // Delivering again what does not match the schema would never help.
      return this.failed(m, ev, new HandlerError(new Error(`malformed event: ${err.message}`), { permanent: true }));
    }
    // A running effect tells JetStream it is alive, so that the event is
    // not handed to another process meanwhile.
    const alive = setInterval(() => m.working(), Math.max(this.cfg.ackWaitMs / 3, 30));
    let outcome;
    try {
      outcome = await apply(this.pool, ev, this.handler);
    } catch (err) {
      return this.failed(m, ev, err);
    } finally {
      clearInterval(alive);
    }
    m.ack();
    this.settled(ev, outcome);
  }

  // failed ends a delivery that failed: a failure of the effect is tried
  // again with backoff and parked past the cap (at once when it is
  // permanent); any other (the database away) is tried again without
  // counting against the event.
  async failed(m, ev, err) {
    const log = this.log.with({ event_id: ev.id, stream_seq: ev.streamSeq, attempt: ev.attempt });
    const delay = this.retryDelay(ev.attempt);
    if (!(err instanceof HandlerError)) {
      log.error('apply event', { error: err, retry_in_ms: delay });
      m.nak(delay);
      return this.settled(ev, 'retry');
    }
    if (!err.permanent && ev.attempt < this.cfg.maxAttempts) {
      log.warn('handler failed; event will be delivered again', { error: err, retry_in_ms: delay });
      m.nak(delay);
      return this.settled(ev, 'retry');
    }
    try {
      await park(this.pool, ev, err);
    } catch (parkErr) {
      // Not parked: the event must not be lost, so it comes back.
      log.error('park event', { error: parkErr, handler_error: err, retry_in_ms: delay });
      m.nak(delay);
      return this.settled(ev, 'retry');
    }
    m.ack();
    log.error('event parked in group_dead_letters', { error: err });
    this.settled(ev, 'parked');
  }

  settled(ev, outcome) {
    this.outcomes[outcome]++;
    this.log.debug('event settled', { event_id: ev.id, stream_seq: ev.streamSeq, outcome });
  }

  // retryDelay is the backoff after the given attempt failed.
  retryDelay(attempt) {
    let d = this.cfg.retryMinMs;
    for (let i = 1; i < attempt && d < this.cfg.retryMaxMs; i++) {
      d *= 2;
    }
    return Math.min(d, this.cfg.retryMaxMs);
  }
}

// replay moves the group's durable consumer back to the start position
// (JetStream's consumer reset, as `baton replay` does) and handles events
// in this process until every event up to the stream's last one at the
// start is settled. Other processes of the group take part; the inbox
// makes an applied event a duplicate, and a parked one is tried again.
async function replay(group, from) {
  const { jsm, stream, cfg, log } = group;
  const info = await jsm.streams.info(stream.name);
  const last = info.state.last_seq;
  const first = await replayStart(jsm, stream, info.state.first_seq, from);
  const total = last >= first ? last - first + 1 : 0;
  const summary = () => ({ group: cfg.group, first_seq: first, last_seq: last, total, ...group.outcomes });
  if (total === 0) {
    return summary();
  }
  await jsm.consumers.reset(stream.name, cfg.group, first);
  log.info('group reset for replay', { first_seq: first, last_seq: last, total, from: from.text });
  let finished = false;
  await group.run(async () => {
    const ci = await jsm.consumers.info(stream.name, cfg.group);
    finished = ci.ack_floor.stream_seq >= last;
    return finished;
  });
  if (!finished) {
    throw new Error(`replay of group ${cfg.group} stopped before its end (${JSON.stringify(summary())})`);
  }
  log.info('replay finished', summary());
  return summary();
}

// position reads where a replay starts from its flags.
function position(values) {
  const given = ['all', 'from-seq', 'since', 'at'].filter((k) => values[k] !== undefined);
  if (given.length !== 1) {
    throw new UsageError('give exactly one of --all, --from-seq N, --since DURATION or --at TIME');
  }
  if (values.all) {
    return { all: true, text: 'all retained events' };
  }
  if (values['from-seq'] !== undefined) {
    if (!/^[1-9][0-9]*$/.test(values['from-seq'])) {
      throw new UsageError(`--from-seq ${JSON.stringify(values['from-seq'])} is not a stream sequence: give a number from 1`);
    }
    return { seq: Number(values['from-seq']), text: `stream sequence ${values['from-seq']}` };
  }
  if (values.since !== undefined) {
    try {
      return { sinceMs: config.parseDuration('--since', values.since), text: `the last ${values.since}` };
    } catch (err) {
      throw new UsageError(err.message);
    }
  }
  const at = new Date(values.at);
  if (!/^\d{4}-\d\d-\d\dT/.test(values.at) || Number.isNaN(at.getTime())) {
    throw new UsageError(`--at ${JSON.stringify(values.at)} is not a time: give RFC 3339, such as 2026-01-02T15:04:05Z`);
  }
  return { at, text: values.at };
}

function command(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        all: { type: 'boolean' },
        'from-seq': { type: 'string' },
        since: { type: 'string' },
        at: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (err) {
    throw new UsageError(err.message);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    return { help: true };
  }
  const [name = 'run', ...rest] = positionals;
  if (!['run', 'replay'].includes(name) || rest.length > 0) {
    throw new UsageError(`unknown command ${JSON.stringify(positionals.join(' '))}`);
  }
  if (name === 'run') {
    if (Object.keys(values).length > 0) {
      throw new UsageError('run takes no flags; --all, --from-seq, --since and --at go with replay');
    }
    return { name };
  }
  return { name, from: position(values) };
}

// connectNATS connects, waiting for a server that is not up yet and
// reconnecting forever, as Baton's components do. What it logs names
// servers without credentials (config.js strips them from the URLs).
async function connectNATS(cfg, log) {
  const opts = {
    servers: cfg.natsServers,
    name: `baton group ${cfg.group}`,
    inboxPrefix: cfg.natsInboxPrefix,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
    waitOnFirstConnect: true,
    ...cfg.natsAuth,
  };
  if (cfg.natsCreds) {
    opts.authenticator = credsAuthenticator(new Uint8Array(cfg.natsCreds));
  } else if (cfg.natsNKeySeed) {
    opts.authenticator = nkeyAuthenticator(new TextEncoder().encode(cfg.natsNKeySeed.toString().trim()));
  }
  if (cfg.natsTLS) {
    opts.tls = cfg.natsTLS;
  }
  const nc = await connect(opts);
  (async () => {
    let logged = '';
    for await (const s of nc.status()) {
      if (s.type === 'disconnect') {
        log.warn('NATS disconnected; reconnecting', { server: s.server });
      } else if (s.type === 'reconnect') {
        logged = '';
        log.info('NATS reconnected', { server: s.server });
      } else if (s.type === 'error' && s.error?.message !== logged) {
        // Once per cause until a connection succeeds.
        logged = s.error?.message;
        log.error('NATS error', { error: s.error });
      }
    }
  })();
  return nc;
}

// checkDatabase waits for PostgreSQL, then refuses to start without the
// tables the group writes: Baton's group tables and the example's own.
async function checkDatabase(pool, log, stop) {
  let logged = '';
  for (let delay = 100; ; delay = Math.min(2 * delay, 5000)) {
    try {
      const { rows } = await pool.query(
        `SELECT to_regclass('group_inbox') IS NOT NULL AS inbox,
                to_regclass('group_dead_letters') IS NOT NULL AS dead_letters,
                to_regclass('event_counts') IS NOT NULL AS counts`
      );
      const t = rows[0];
      if (!t.inbox || !t.dead_letters) {
        throw new Refusal('the database has no group_inbox or group_dead_letters: migrate it first (baton migrate), or check BATON_DATABASE_URL');
      }
      if (!t.counts) {
        throw new Refusal('the table event_counts does not exist for this role: run counts.sql as the group\'s role first (psql "$BATON_DATABASE_URL" -f examples/group-node/counts.sql)');
      }
      return true;
    } catch (err) {
      if (err instanceof Refusal || err.code === '28P01' || err.code === '28000' || err.code === '3D000') {
        // A refusal, a wrong password or a missing database: waiting
        // would not cure it.
        throw err;
      }
      if (err.message !== logged) {
        logged = err.message;
        log.warn('waiting for PostgreSQL', { error: err, retry_in_ms: delay });
      }
    }
    if (!(await stop.sleep(delay))) {
      return false;
    }
  }
}

async function main() {
  let cmd;
  let cfg;
  try {
    cmd = command(process.argv.slice(2));
    if (cmd.help) {
      process.stdout.write(usage + '\n');
      return 0;
    }
    cfg = config.load();
  } catch (err) {
    if (err instanceof UsageError || err instanceof config.ConfigError) {
      process.stderr.write(`${err.message}\n${usage}\n`);
      return 2;
    }
    throw err;
  }
  const log = logger({ component: 'group', group: cfg.group }, cfg.logLevel);
  const stop = stopper(log);
  const validate = validator();
  const pool = new Pool({
    connectionString: cfg.databaseURL,
    application_name: `baton group ${cfg.group}`,
    max: 4,
    // A server that does not answer fails the attempt, which is retried,
    // instead of holding the event for the system's TCP timeout.
    connectionTimeoutMillis: 10_000,
  });
  // An idle connection that breaks is replaced at its next use.
  pool.on('error', (err) => log.warn('idle database connection failed', { error: err }));
  let nc;
  try {
    if (!(await checkDatabase(pool, log, stop))) {
      return 0;
    }
    const connecting = connectNATS(cfg, log);
    nc = await Promise.race([connecting, new Promise((resolve) => stop.onStop(() => resolve(null)))]);
    if (!nc) {
      connecting.then((late) => late.close(), () => {});
      return 0;
    }
    const js = jetstream(nc);
    // checkAPI off: a group's NATS user may use its own durable, not ask
    // for the account's JetStream info.
    const jsm = await jetstreamManager(nc, { checkAPI: false });
    // A group owns only its durable consumer; the stream is the relay's.
    // A running group waits for a stream that is not there yet; a replay,
    // which a person runs, says so at once.
    const stream = await joinStream(jsm, cfg.stream, log, stop, { wait: cmd.name === 'run' });
    if (!stream) {
      return 0;
    }
    if (await ensureDurable(jsm, cfg, stream, log)) {
      log.info('created the group\'s durable consumer', { stream: stream.name, consumer: cfg.group });
    }
    const group = new Group({ cfg, log, pool, js, jsm, stream, validate, handler: countEvent, stop });
    if (cmd.name === 'replay') {
      const summary = await replay(group, cmd.from);
      process.stdout.write(JSON.stringify(summary) + '\n');
      return 0;
    }
    log.info('group started', { stream: stream.name, consumer: cfg.group });
    await group.run();
    log.info('group stopped', group.outcomes);
    return 0;
  } catch (err) {
    log.error(err instanceof Refusal ? 'refusing to start' : 'group failed', { error: err });
    return 1;
  } finally {
    // Drain sends the acks still buffered before it closes.
    await nc?.drain().catch(() => {});
    await pool.end().catch(() => {});
  }
}

main().then((code) => {
  process.exitCode = code;
}, (err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exitCode = 1;
});
