// A Mastra agent served over AG-UI 1.0 with @ag-ui/mastra, for Baton's
// worker (`baton worker --agent ag-ui`). Baton drives the loop: each step
// of a turn is one run, posted here as a RunAgentInput with the
// conversation, the turn's earlier steps and their tool results, and the
// tools Baton declares (docs/guides/agents.md). The route checks that the
// request comes from Baton and answers the adapter's events as server-sent
// events; a call of a declared tool ends the run after TOOL_CALL_END, and
// Baton runs it, journaled, and posts the next step. The adapter ships no
// HTTP server: this is one, with node:http.
//
//	PORT=8789 BATON_JWKS_URL=http://127.0.0.1:8080/.well-known/jwks.json node server.js
import http from "node:http";
import { EventType } from "@ag-ui/core";
import { RunAgentInputSchema } from "@ag-ui/core/schemas";
import { EventEncoder } from "@ag-ui/encoder";
import { mastraAgent, run } from "./agent.js";
import { batonVerifier, KeysUnavailable, Refused } from "./auth.js";
import { logger } from "./log.js";

const route = "/api/agent";
const host = process.env.HOST ?? "127.0.0.1";
const port = Number(process.env.PORT ?? 8789);
const jwksURL = process.env.BATON_JWKS_URL ?? "http://127.0.0.1:8080/.well-known/jwks.json";
const issuer = process.env.BATON_ISSUER ?? "baton";
const slowDelayMs = Number(process.env.AGENT_SLOW_DELAY_MS ?? 100);
// The largest request read: Baton sends the whole conversation each step.
const maxBodyBytes = 16 << 20;

const log = logger({ component: "agent-mastra" });
const agent = mastraAgent({ slowDelayMs });
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
  const parsed = RunAgentInputSchema.safeParse(body);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    return answerError(res, 400, "bad_body", `not a RunAgentInput: ${issue.path.join(".")}: ${issue.message}`);
  }
  const input = parsed.data;
  const baton = input.forwardedProps?.baton ?? {};
  const idempotencyKey = req.headers["idempotency-key"];
  // The token is for one step of one conversation: not for another's.
  if (who.step !== input.runId || who.conversation !== baton.conversation || (idempotencyKey && idempotencyKey !== input.runId)) {
    log.warn("refused a request whose token is for another step", { run_id: input.runId, idempotency_key: idempotencyKey });
    return answerError(res, 401, "unauthorized", "the token is for another step");
  }
  log.info("step request", {
    run_id: input.runId,
    idempotency_key: idempotencyKey,
    conversation: baton.conversation,
    turn: baton.turn,
    step: baton.step,
    attempt: baton.attempt,
    user: who.user,
    messages: input.messages.length,
    tools: input.tools.map((t) => t.name),
  });

  // Stop in Baton closes the request: the run stops too (the adapter's
  // abortRun(); it does not stop the model's stream by itself).
  const abort = new AbortController();
  res.on("close", () => {
    if (!res.writableFinished) {
      log.info("request closed by the client", { run_id: input.runId });
      abort.abort();
    }
  });
  const encoder = new EventEncoder({ accept: req.headers.accept });
  res.writeHead(200, { "Content-Type": encoder.getContentType(), "Cache-Control": "no-cache" });
  try {
    for await (const event of run(agent, input, { user: who.user, signal: abort.signal })) {
      res.write(encoder.encode(event));
    }
  } catch (err) {
    if (abort.signal.aborted) return;
    log.error("run failed", { run_id: input.runId, error: err });
    res.write(encoder.encode({ type: EventType.RUN_ERROR, message: "the agent failed" }));
  }
  res.end();
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
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    answerError(res, 400, "bad_json", "the body is not JSON");
    return undefined;
  }
}

function answerError(res, status, code, message) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ error: { code, message } }));
}
