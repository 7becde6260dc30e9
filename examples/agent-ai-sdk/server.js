// An agent served as an AI SDK chat route, for Baton's worker
// (`baton worker --agent ai-sdk`). Baton drives the loop: each step of a
// turn is one POST here, with the conversation, the turn's earlier steps
// and their tool results, and the tools Baton declares
// (docs/guides/agents.md). The route checks that the request comes from
// Baton, declares Baton's tools to the model without running them, and
// answers with the model's UI message stream: a call of one of the tools
// ends the step, and Baton runs it, journaled, and posts the next step.
//
//	PORT=8787 BATON_JWKS_URL=http://127.0.0.1:8080/.well-known/jwks.json node server.js
import http from "node:http";
import { convertToModelMessages, jsonSchema, streamText, tool } from "ai";
import { batonVerifier, KeysUnavailable, Refused } from "./auth.js";
import { logger } from "./log.js";
import { scriptedModel } from "./model.js";

const route = "/api/chat";
const host = process.env.HOST ?? "127.0.0.1";
const port = Number(process.env.PORT ?? 8787);
const jwksURL = process.env.BATON_JWKS_URL ?? "http://127.0.0.1:8080/.well-known/jwks.json";
const issuer = process.env.BATON_ISSUER ?? "baton";
const slowDelayMs = Number(process.env.AGENT_SLOW_DELAY_MS ?? 100);
// The largest request read: Baton sends the whole conversation each step.
const maxBodyBytes = 16 << 20;

const log = logger({ component: "agent-ai-sdk" });
const model = scriptedModel({ slowDelayMs });
let verify;

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    log.error("request failed", { error: err });
    if (!res.headersSent) answerError(res, 500, "internal", "the agent failed");
    else res.destroy();
  });
});

server.listen(port, host, () => {
  const { port: bound } = server.address();
  // The tokens' aud: by default the origin Baton posts to, the origin of
  // the worker's --agent-url (or its --agent-audience).
  const audience = process.env.AGENT_AUDIENCE ?? `http://${host}:${bound}`;
  verify = batonVerifier({ jwksURL, issuer, audience });
  log.info("listening", { url: `http://${host}:${bound}${route}`, audience, jwks_url: jwksURL });
});

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    log.info("stopping", { signal });
    server.close(() => process.exit(0));
    server.closeAllConnections();
  });
}

async function handle(req, res) {
  const { pathname } = new URL(req.url, "http://agent");
  if (pathname !== route) return answerError(res, 404, "not_found", `no route ${pathname}: the agent answers POST ${route}`);
  if (req.method !== "POST") {
    res.setHeader("Allow", "POST");
    return answerError(res, 405, "method_not_allowed", `${route} answers POST`);
  }
  let who;
  try {
    who = await verify(req.headers.authorization);
  } catch (err) {
    if (err instanceof KeysUnavailable) {
      log.warn("cannot check a request's token", { error: err });
      res.setHeader("Retry-After", "5");
      return answerError(res, 503, "unavailable", "the agent cannot check tokens now");
    }
    if (!(err instanceof Refused)) throw err;
    log.warn("refused a request whose token does not come from Baton", {
      reason: err.message,
      idempotency_key: req.headers["idempotency-key"],
    });
    return answerError(res, 401, "unauthorized", "a bearer token signed by Baton is required");
  }
  const body = await readJSON(req, res);
  if (body === undefined) return;
  const step = body.baton ?? {};
  const idempotencyKey = req.headers["idempotency-key"];
  // The token is for one step of one conversation: not for another's.
  if (who.step !== step.runId || who.conversation !== step.conversation || (idempotencyKey && idempotencyKey !== step.runId)) {
    log.warn("refused a request whose token is for another step", { run_id: step.runId, idempotency_key: idempotencyKey });
    return answerError(res, 401, "unauthorized", "the token is for another step");
  }
  log.info("step request", {
    run_id: step.runId,
    idempotency_key: idempotencyKey,
    conversation: step.conversation,
    turn: step.turn,
    step: step.step,
    attempt: step.attempt,
    user: who.user,
    messages: body.messages?.length ?? 0,
    tools: (body.tools ?? []).map((t) => t.name),
  });

  // Baton's tools, declared without execute: a call of one ends the
  // stream, and Baton runs it.
  const tools = Object.fromEntries(
    (body.tools ?? []).map((t) => [t.name, tool({ description: t.description, inputSchema: jsonSchema(t.inputSchema) })]),
  );
  const messages = await convertToModelMessages(body.messages ?? [], { tools });

  // Stop in Baton closes the request: the model stops too.
  const abort = new AbortController();
  res.on("close", () => {
    if (!res.writableFinished) {
      log.info("request closed by the client", { run_id: step.runId });
      abort.abort();
    }
  });
  const result = streamText({ model, messages, tools, abortSignal: abort.signal });
  result.pipeUIMessageStreamToResponse(res);
}

// readJSON reads the request's body as JSON, or answers 400 or 413 and
// returns undefined.
async function readJSON(req, res) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > maxBodyBytes) {
      answerError(res, 413, "body_too_large", `the body is larger than ${maxBodyBytes} bytes`);
      return undefined;
    }
    chunks.push(chunk);
  }
  let body;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    answerError(res, 400, "bad_json", "the body is not JSON");
    return undefined;
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    answerError(res, 400, "bad_body", "the body is not a JSON object");
    return undefined;
  }
  return body;
}

function answerError(res, status, code, message) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ error: { code, message } }));
}
