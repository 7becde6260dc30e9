// The outbox stream and the group's durable consumer on it, as Baton's Go
// groups see them (nats/stream.go, nats/consumer.go, consumer/pull). The
// stream is the relay's: the group reads it as it is, waits while it does
// not exist yet, and never changes it. The durable consumer is the
// group's own: created when missing, and brought back to the group's
// settings when it drifted, except for the settings JetStream cannot
// change in place, where the group refuses to start and says what to do.
'use strict';

const { AckPolicy, DeliverPolicy, ReplayPolicy, JetStreamApiError, JetStreamApiCodes } = require('@nats-io/jetstream');
const { nanos } = require('@nats-io/transport-node');

// Refusal is a disagreement that only a person can settle: the process
// exits instead of waiting.
class Refusal extends Error {}

const isAPI = (err, code) => err instanceof JetStreamApiError && err.code === code;

// waitable reports whether err is NATS or the stream being away for now
// (not connected yet, no JetStream leader, a request timed out), which
// waiting cures.
function waitable(err) {
  if (err instanceof JetStreamApiError) {
    // 503: JetStream is not available (a cluster without a leader).
    return err.status === 503 || err.code === JetStreamApiCodes.StreamNotFound;
  }
  return ['TimeoutError', 'NoRespondersError', 'ConnectionError', 'ClosedConnectionError', 'RequestError'].includes(err?.name) ||
    /timeout|no responders|disconnect|not connected|reconnect/i.test(err?.message ?? '');
}

// joinStream waits until the outbox stream exists (its owner, baton relay,
// creates it) and returns its name and subject prefix. It gives up when
// stop says so (returning null), on a stream that is not Baton's outbox (a
// Refusal), and, unless wait is set, on a stream that does not exist.
async function joinStream(jsm, name, log, stop, { wait = true } = {}) {
  let logged = '';
  for (let delay = 100; ; delay = Math.min(2 * delay, 5000)) {
    let err;
    try {
      const info = await jsm.streams.info(name);
      const subjects = info.config.subjects ?? [];
      if (subjects.length !== 1 || !subjects[0].endsWith('.>')) {
        throw new Refusal(`stream ${name} has subjects ${JSON.stringify(subjects)}, not one <prefix>.> filter: it was not provisioned by baton relay; check BATON_STREAM`);
      }
      if (logged) {
        log.info('outbox stream found', { stream: name });
      }
      return { name, prefix: subjects[0].slice(0, -2) };
    } catch (e) {
      err = e;
    }
    if (!waitable(err)) {
      throw err;
    }
    const missing = isAPI(err, JetStreamApiCodes.StreamNotFound);
    const why = missing
      ? `stream ${name} does not exist (its owner, baton relay, creates it; start it, or check BATON_STREAM)`
      : `read stream ${name}: ${err.message}`;
    if (missing && !wait) {
      throw new Refusal(why);
    }
    if (why !== logged) {
      log.warn('waiting for the outbox stream', { error: why, retry_in_ms: delay });
      logged = why;
    }
    if (!(await stop.sleep(delay))) {
      return null;
    }
  }
}

// durableConfig is the group's durable consumer, as the Go groups make
// theirs: explicit acks (an event is acked only after the transaction that
// applied it committed), every event of the stream from its first, no
// broker cap on deliveries (attempts are counted by the group and end in a
// visible dead letter, where a broker cap would drop an event silently).
function durableConfig(cfg, stream) {
  return {
    durable_name: cfg.group,
    description: `Baton group ${cfg.group}`,
    filter_subject: `${stream.prefix}.>`,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(cfg.ackWaitMs),
    max_deliver: -1,
    max_ack_pending: cfg.maxAckPending,
    deliver_policy: DeliverPolicy.All,
    replay_policy: ReplayPolicy.Instant,
  };
}

// ensureDurable creates the group's durable consumer, or brings an existing
// one back to the group's settings, and refuses one that JetStream cannot
// change in place. It reports whether it created the consumer.
async function ensureDurable(jsm, cfg, stream, log) {
  const want = durableConfig(cfg, stream);
  let have;
  try {
    have = (await jsm.consumers.info(stream.name, cfg.group)).config;
  } catch (err) {
    if (!isAPI(err, JetStreamApiCodes.ConsumerNotFound)) {
      throw err;
    }
    await jsm.consumers.add(stream.name, want);
    return true;
  }
  // Settings JetStream keeps for a consumer's life: changing them means a
  // new consumer, which a person decides on.
  const fixed = [];
  if (have.deliver_subject) {
    fixed.push(`a push delivery subject (${have.deliver_subject}), where the group pulls`);
  }
  for (const [setting, key] of [['deliver policy', 'deliver_policy'], ['ack policy', 'ack_policy'], ['replay policy', 'replay_policy']]) {
    if (have[key] !== want[key]) {
      fixed.push(`${setting} ${have[key]} (the group's is ${want[key]})`);
    }
  }
  if (fixed.length > 0) {
    throw new Refusal(`the durable consumer ${cfg.group} on stream ${stream.name} exists with ${fixed.join(', ')}, which cannot be changed in place: ` +
      `if it is this group's, delete it (nats consumer rm ${stream.name} ${cfg.group}) and start the group again, which creates it anew and goes through the stream's retention from its first event, applying none twice (the inbox has them); ` +
      `if it belongs to something else, give this group another name (BATON_GROUP)`);
  }
  const filter = have.filter_subject || (have.filter_subjects ?? []).join(',');
  const changes = [];
  const compare = (setting, from, to) => {
    if (String(from) !== String(to)) {
      changes.push({ setting, from: String(from), to: String(to) });
    }
  };
  compare('description', have.description ?? '', want.description);
  compare('filter subject', filter, want.filter_subject);
  compare('ack wait', `${have.ack_wait / 1e6}ms`, `${want.ack_wait / 1e6}ms`);
  compare('max deliver', have.max_deliver, want.max_deliver);
  compare('max ack pending', have.max_ack_pending, want.max_ack_pending);
  compare('backoff', (have.backoff ?? []).join(','), '');
  if (changes.length === 0) {
    return false;
  }
  // update merges these into the consumer's settings; an undefined one is
  // left out, which clears it.
  await jsm.consumers.update(stream.name, cfg.group, {
    description: want.description,
    filter_subject: want.filter_subject,
    filter_subjects: undefined,
    ack_wait: want.ack_wait,
    max_deliver: want.max_deliver,
    max_ack_pending: want.max_ack_pending,
    backoff: undefined,
  });
  for (const c of changes) {
    log.warn('changed a setting of the group\'s durable consumer', { consumer: cfg.group, ...c });
  }
  return false;
}

// replayStart resolves where a replay starts into a stream sequence, as
// `baton replay` does: the first retained event, a sequence (or the first
// retained one, if it is gone), or the first event stored at or after a
// time, which the server finds itself through a short-lived consumer that
// changes no group's state.
async function replayStart(jsm, stream, firstSeq, from) {
  const first = Math.max(firstSeq, 1);
  if (from.all) {
    return first;
  }
  if (from.seq) {
    return Math.max(from.seq, first);
  }
  const at = from.sinceMs ? new Date(Date.now() - from.sinceMs) : from.at;
  const ci = await jsm.consumers.add(stream.name, {
    description: 'baton replay: find the first event at a time',
    deliver_policy: DeliverPolicy.StartTime,
    opt_start_time: at.toISOString(),
    ack_policy: AckPolicy.None,
    inactive_threshold: nanos(60_000),
    mem_storage: true,
    num_replicas: 1,
  });
  try {
    return Math.max(ci.delivered.stream_seq + 1, first);
  } finally {
    // Left behind, it would expire after its inactive threshold anyway.
    await jsm.consumers.delete(stream.name, ci.name).catch(() => {});
  }
}

module.exports = { joinStream, ensureDurable, durableConfig, replayStart, Refusal, isAPI, JetStreamApiCodes };
