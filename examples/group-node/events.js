// Checks each delivered event against the published JSON Schema of an
// outbox trigger, docs/events/trigger.schema.json (draft 2020-12): the
// same file Baton's Go tests check what the relay publishes against. The
// subject, the headers and the body are each checked, as the Go function
// events.ValidateMessage does, with date-time asserted as a format.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const Ajv2020 = require('ajv/dist/2020');
const addFormats = require('ajv-formats');

// The schemas are read from the repository, beside this example.
const schemaDir = path.join(__dirname, '..', '..', 'docs', 'events');

function loadTriggerSchema(dir = schemaDir) {
  const file = path.join(dir, 'trigger.schema.json');
  const schema = JSON.parse(fs.readFileSync(file, 'utf8'));
  // Ajv's strict mode goes beyond the standard; these three checks would
  // refuse schemas that are valid 2020-12 (a "required" under "not", a
  // header that both a property and a pattern describe), so they are off.
  const ajv = new Ajv2020({ allErrors: true, strictRequired: false, strictTypes: false, allowMatchingProperties: true });
  addFormats(ajv);
  ajv.addSchema(schema, 'trigger');
  const compile = (ref) => {
    const v = ajv.getSchema(ref);
    if (!v) {
      throw new Error(`${file} has no ${ref}`);
    }
    return v;
  };
  return {
    file,
    body: compile('trigger'),
    subject: compile('trigger#/$defs/subject'),
    headers: compile('trigger#/$defs/headers'),
    errorsText: (errors, dataVar) => ajv.errorsText(errors, { dataVar }),
  };
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

// validator returns a function that checks a delivered message (subject,
// headers as {name: [values]}, body bytes) and returns the parsed trigger,
// or throws an error that says every way the message breaks the schema.
function validator(dir) {
  const s = loadTriggerSchema(dir);
  return function validate(subject, headers, data) {
    const problems = [];
    if (!s.subject(subject)) {
      problems.push(`subject ${JSON.stringify(subject)}: ${s.errorsText(s.subject.errors, 'subject')}`);
    }
    const one = {};
    for (const [name, values] of Object.entries(headers)) {
      if (values.length !== 1) {
        problems.push(`header ${name} has ${values.length} values: want one`);
      }
      one[name] = values[0];
    }
    if (!s.headers(one)) {
      problems.push(`headers: ${s.errorsText(s.headers.errors, 'headers')}`);
    }
    let trigger;
    try {
      trigger = JSON.parse(utf8.decode(data));
    } catch (err) {
      problems.push(`body is not one JSON value in UTF-8: ${err.message}`);
    }
    if (trigger !== undefined && !s.body(trigger)) {
      problems.push(`body: ${s.errorsText(s.body.errors, 'body')}`);
    }
    if (problems.length > 0) {
      throw new Error(`does not match ${path.basename(s.file)}: ${problems.join('; ')}`);
    }
    return trigger;
  };
}

module.exports = { validator, schemaDir };
