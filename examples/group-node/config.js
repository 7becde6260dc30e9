// The group's configuration, from environment variables with the names
// Baton's own commands read (`source .baton/dev.env` sets the first
// three). Every error names the variable and says how to fix it, and never
// quotes a secret: a URL's password or token, a file's content.
'use strict';

const fs = require('node:fs');

// Defaults, the same as Baton's Go groups (consumer/group, nats).
const defaults = {
  natsURL: 'nats://127.0.0.1:4222',
  stream: 'BATON_OUTBOX',
  group: 'counts',
  maxAttempts: 5,
  retryMinMs: 1000,
  retryMaxMs: 60_000,
  ackWaitMs: 30_000,
  maxAckPending: 1000,
  logLevel: 'info',
};

class ConfigError extends Error {
  constructor(variable, problem) {
    super(`${variable}: ${problem}`);
    this.variable = variable;
  }
}

// parseDuration reads a Go duration ("500ms", "1s", "1m30s") into
// milliseconds.
function parseDuration(variable, text) {
  const units = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  const part = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/y;
  let ms = 0;
  let at = 0;
  while (at < text.length) {
    part.lastIndex = at;
    const m = part.exec(text);
    if (!m) {
      throw new ConfigError(variable, `${JSON.stringify(text)} is not a duration: give one such as 500ms, 1s or 2m`);
    }
    ms += Number(m[1]) * units[m[2]];
    at = part.lastIndex;
  }
  if (text === '' || ms <= 0) {
    throw new ConfigError(variable, `${JSON.stringify(text)} is not a positive duration: give one such as 500ms, 1s or 2m`);
  }
  return ms;
}

function positiveInt(variable, text) {
  if (!/^[1-9][0-9]*$/.test(text)) {
    throw new ConfigError(variable, `${JSON.stringify(text)} is not a positive whole number`);
  }
  return Number(text);
}

// name checks a stream or group name as JetStream and Baton take it.
function name(variable, text, example) {
  if (!/^[A-Za-z0-9_-]+$/.test(text)) {
    throw new ConfigError(variable, `${JSON.stringify(text)} is not a name: use letters, digits, '-' and '_', such as ${example}`);
  }
  return text;
}

// natsServers splits BATON_NATS_URL into server addresses without
// credentials, and the user and password, or the token, that one of them
// carried, as the Go client reads them (nats://user:pass@host,
// nats://token@host).
function natsServers(text) {
  const servers = [];
  const auth = {};
  const elements = text.split(',').map((s) => s.trim()).filter(Boolean);
  if (elements.length === 0) {
    throw new ConfigError('BATON_NATS_URL', 'is empty: give the NATS server URL, such as nats://127.0.0.1:4222');
  }
  elements.forEach((element, i) => {
    let u;
    try {
      u = new URL(element.includes('://') ? element : `nats://${element}`);
    } catch {
      // The element may hold a password: it is not quoted.
      throw new ConfigError('BATON_NATS_URL', `element ${i + 1} is not a URL: give nats://HOST:PORT, comma-separated (percent-encode a password's special characters, or use BATON_NATS_CREDS)`);
    }
    if (u.username && !auth.user && !auth.token) {
      if (u.password) {
        auth.user = decodeURIComponent(u.username);
        auth.pass = decodeURIComponent(u.password);
      } else {
        auth.token = decodeURIComponent(u.username);
      }
    }
    servers.push(`${u.protocol}//${u.host}`);
  });
  return { servers, auth };
}

// readFile reads a file named by a variable, refusing at once a missing
// or unreadable one; the content is never quoted.
function readFile(variable, path) {
  try {
    return fs.readFileSync(path);
  } catch (err) {
    throw new ConfigError(variable, `cannot read ${path} (${err.code || 'error'}): give the path of a readable file`);
  }
}

// load reads the configuration from env.
function load(env = process.env) {
  const c = { ...defaults };
  c.databaseURL = env.BATON_DATABASE_URL;
  if (!c.databaseURL) {
    throw new ConfigError('BATON_DATABASE_URL', 'is not set: give the PostgreSQL URL of the group\'s role, such as postgres://counts@127.0.0.1:5432/baton (`source .baton/dev.env` sets it for `make dev`)');
  }
  c.group = name('BATON_GROUP', env.BATON_GROUP ?? defaults.group, 'counts');
  c.stream = name('BATON_STREAM', env.BATON_STREAM || defaults.stream, defaults.stream);
  const nats = natsServers(env.BATON_NATS_URL || defaults.natsURL);
  c.natsServers = nats.servers;
  c.natsAuth = nats.auth;
  if (env.BATON_NATS_CREDS && env.BATON_NATS_NKEY_SEED) {
    throw new ConfigError('BATON_NATS_CREDS', 'and BATON_NATS_NKEY_SEED are both set: give one way to log in');
  }
  if (env.BATON_NATS_CREDS) {
    c.natsCreds = readFile('BATON_NATS_CREDS', env.BATON_NATS_CREDS);
  }
  if (env.BATON_NATS_NKEY_SEED) {
    c.natsNKeySeed = readFile('BATON_NATS_NKEY_SEED', env.BATON_NATS_NKEY_SEED);
  }
  if (env.BATON_NATS_TLS_CA || env.BATON_NATS_TLS_CERT || env.BATON_NATS_TLS_KEY) {
    if (!env.BATON_NATS_TLS_CERT !== !env.BATON_NATS_TLS_KEY) {
      throw new ConfigError('BATON_NATS_TLS_CERT', 'and BATON_NATS_TLS_KEY go together: give both, or neither');
    }
    c.natsTLS = {};
    if (env.BATON_NATS_TLS_CA) {
      c.natsTLS.ca = readFile('BATON_NATS_TLS_CA', env.BATON_NATS_TLS_CA).toString();
    }
    if (env.BATON_NATS_TLS_CERT) {
      c.natsTLS.cert = readFile('BATON_NATS_TLS_CERT', env.BATON_NATS_TLS_CERT).toString();
      c.natsTLS.key = readFile('BATON_NATS_TLS_KEY', env.BATON_NATS_TLS_KEY).toString();
    }
  }
  // Replies arrive under a prefix of the group's own, which a secured
  // server lets only this group's user read (deploy/nats/accounts.conf).
  c.natsInboxPrefix = env.BATON_NATS_INBOX_PREFIX || `_INBOX_${c.group}`;
  if (env.BATON_GROUP_MAX_ATTEMPTS) {
    c.maxAttempts = positiveInt('BATON_GROUP_MAX_ATTEMPTS', env.BATON_GROUP_MAX_ATTEMPTS);
  }
  if (env.BATON_GROUP_RETRY_MIN) {
    c.retryMinMs = parseDuration('BATON_GROUP_RETRY_MIN', env.BATON_GROUP_RETRY_MIN);
    c.retryMaxMs = Math.max(c.retryMaxMs, c.retryMinMs);
  }
  if (env.BATON_GROUP_RETRY_MAX) {
    c.retryMaxMs = parseDuration('BATON_GROUP_RETRY_MAX', env.BATON_GROUP_RETRY_MAX);
    if (c.retryMaxMs < c.retryMinMs) {
      throw new ConfigError('BATON_GROUP_RETRY_MAX', `${env.BATON_GROUP_RETRY_MAX} is below the retry min (BATON_GROUP_RETRY_MIN)`);
    }
  }
  if (env.BATON_GROUP_ACK_WAIT) {
    c.ackWaitMs = parseDuration('BATON_GROUP_ACK_WAIT', env.BATON_GROUP_ACK_WAIT);
    if (c.ackWaitMs < 100) {
      throw new ConfigError('BATON_GROUP_ACK_WAIT', `${env.BATON_GROUP_ACK_WAIT} is too short: give at least 100ms`);
    }
  }
  if (env.BATON_LOG_LEVEL) {
    if (!['debug', 'info', 'warn', 'error'].includes(env.BATON_LOG_LEVEL)) {
      throw new ConfigError('BATON_LOG_LEVEL', `${JSON.stringify(env.BATON_LOG_LEVEL)} is not a level: give debug, info, warn or error`);
    }
    c.logLevel = env.BATON_LOG_LEVEL;
  }
  return c;
}

module.exports = { load, parseDuration, ConfigError, defaults };
