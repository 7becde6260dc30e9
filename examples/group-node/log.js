// Logs as Baton's Go services write them: one JSON object a line on
// standard error, with level, time, component and message, and snake_case
// fields. Nothing that is logged holds a secret: URLs are redacted before
// they get here (config.js), and errors from the drivers name hosts and
// users, never passwords.
'use strict';

const levels = { debug: 0, info: 1, warn: 2, error: 3 };

function logger(fields = {}, minLevel = 'info') {
  const min = levels[minLevel] ?? levels.info;
  const write = (level, message, extra = {}) => {
    if (levels[level] < min) {
      return;
    }
    const line = { level, time: new Date().toISOString(), ...fields };
    for (const [k, v] of Object.entries(extra)) {
      line[k] = v instanceof Error ? v.message : v;
    }
    line.message = message;
    process.stderr.write(JSON.stringify(line) + '\n');
  };
  return {
    debug: (message, extra) => write('debug', message, extra),
    info: (message, extra) => write('info', message, extra),
    warn: (message, extra) => write('warn', message, extra),
    error: (message, extra) => write('error', message, extra),
    with: (more) => logger({ ...fields, ...more }, minLevel),
  };
}

module.exports = { logger, levels };
