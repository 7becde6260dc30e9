// Logs as Baton's services write them: one JSON object a line on standard
// error, with level, time, component and message, and snake_case fields.
// Nothing logged holds a secret: never a token, only what it says.

export function logger(fields = {}) {
  const write = (level, message, extra = {}) => {
    const line = { level, time: new Date().toISOString(), ...fields };
    for (const [k, v] of Object.entries(extra)) {
      line[k] = v instanceof Error ? v.message : v;
    }
    line.message = message;
    process.stderr.write(JSON.stringify(line) + "\n");
  };
  return {
    info: (message, extra) => write("info", message, extra),
    warn: (message, extra) => write("warn", message, extra),
    error: (message, extra) => write("error", message, extra),
  };
}
