// A small A2A v1.0 agent served by the A2A JavaScript SDK over JSON-RPC,
// for the tests of Baton's A2A step provider. It runs no model: what it
// does depends on the first word of the user's text.
//
//   reply <text>   streams <text> as an artifact, a few characters per
//                  update, and completes
//   slow <text>    the same, a piece every 100 ms
//   status <text>  completes with <text> as the status message and no
//                  artifact
//   hang           works until it is canceled
//   ask <question> asks for input (INPUT_REQUIRED) with <question>
//   fail <text>    fails with <text> as the status message
//   reject         rejects the task
//
// It listens on 127.0.0.1 at the port given as its first argument (0 for
// any) and prints {"url": ...} on one line once it listens: the JSON-RPC
// endpoint is <url>/a2a, its agent card at /.well-known/agent-card.json.
import express from "express";
import { TaskState, Role } from "@a2a-js/sdk";
import { DefaultRequestHandler, InMemoryTaskStore } from "@a2a-js/sdk/server";
import { jsonRpcHandler, agentCardHandler, UserBuilder } from "@a2a-js/sdk/server/express";

const text = (value) => ({ content: { $case: "text", value }, metadata: {}, filename: "", mediaType: "text/plain" });
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function agentMessage(ctx, value) {
  return {
    messageId: crypto.randomUUID(),
    contextId: ctx.contextId,
    taskId: ctx.taskId,
    role: Role.ROLE_AGENT,
    parts: [text(value)],
    metadata: {},
    extensions: [],
    referenceTaskIds: [],
  };
}

function status(ctx, state, message) {
  return {
    kind: "statusUpdate",
    data: {
      taskId: ctx.taskId,
      contextId: ctx.contextId,
      status: { state, message: message ? agentMessage(ctx, message) : undefined, timestamp: new Date().toISOString() },
      metadata: {},
    },
  };
}

function artifact(ctx, id, piece, append, lastChunk) {
  return {
    kind: "artifactUpdate",
    data: {
      taskId: ctx.taskId,
      contextId: ctx.contextId,
      artifact: { artifactId: id, name: "answer", description: "", parts: [text(piece)], metadata: {}, extensions: [] },
      append,
      lastChunk,
      metadata: {},
    },
  };
}

class ScriptedAgent {
  canceled = new Set();

  async execute(ctx, bus) {
    const words = ctx.userMessage.parts.map((p) => (p.content?.$case === "text" ? p.content.value : "")).join("\n");
    const [verb, ...rest] = words.trim().split(/\s+/);
    const arg = rest.join(" ");
    // A stream begins with its task: a new one, or the one the message
    // continues (the answer to a question it asked).
    bus.publish({
      kind: "task",
      data: ctx.task ?? {
        id: ctx.taskId,
        contextId: ctx.contextId,
        status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: new Date().toISOString() },
        artifacts: [],
        history: [ctx.userMessage],
        metadata: {},
      },
    });
    bus.publish(status(ctx, TaskState.TASK_STATE_WORKING, "working on it"));
    switch (verb) {
      case "reply":
      case "slow": {
        const pieces = arg.match(/.{1,4}/gs) ?? [];
        for (let i = 0; i < pieces.length; i++) {
          if (verb === "slow" && i > 0) await sleep(100);
          if (this.canceled.has(ctx.taskId)) return;
          bus.publish(artifact(ctx, "answer", pieces[i], i > 0, i === pieces.length - 1));
        }
        bus.publish(status(ctx, TaskState.TASK_STATE_COMPLETED));
        break;
      }
      case "status":
        bus.publish(status(ctx, TaskState.TASK_STATE_COMPLETED, arg));
        break;
      case "hang":
        bus.publish(artifact(ctx, "answer", "thinking", false, false));
        while (!this.canceled.has(ctx.taskId)) await sleep(20);
        return;
      case "ask":
        bus.publish(status(ctx, TaskState.TASK_STATE_INPUT_REQUIRED, arg));
        break;
      case "fail":
        bus.publish(status(ctx, TaskState.TASK_STATE_FAILED, arg));
        break;
      case "reject":
        bus.publish(status(ctx, TaskState.TASK_STATE_REJECTED, "I do not do that"));
        break;
      default:
        bus.publish(status(ctx, TaskState.TASK_STATE_FAILED, `unknown verb ${verb}`));
    }
    bus.finished();
  }

  async cancelTask(taskId, bus) {
    this.canceled.add(taskId);
    bus.publish({
      kind: "statusUpdate",
      data: {
        taskId,
        contextId: "",
        status: { state: TaskState.TASK_STATE_CANCELED, message: undefined, timestamp: new Date().toISOString() },
        metadata: {},
      },
    });
    bus.finished();
  }
}

const port = Number(process.argv[2] ?? 0);
const app = express();
const server = app.listen(port, "127.0.0.1", () => {
  const url = `http://127.0.0.1:${server.address().port}`;
  const card = {
    name: "scripted",
    description: "A scripted A2A agent for Baton's tests.",
    supportedInterfaces: [{ url: `${url}/a2a`, protocolBinding: "JSONRPC", tenant: "", protocolVersion: "1.0" }],
    provider: undefined,
    version: "1.0.0",
    capabilities: { streaming: true, pushNotifications: false, extensions: [] },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ["text/plain"],
    defaultOutputModes: ["text/plain"],
    skills: [],
    signatures: [],
  };
  const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), new ScriptedAgent());
  app.use("/.well-known/agent-card.json", agentCardHandler({ agentCardProvider: handler }));
  app.use("/a2a", jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));
  console.log(JSON.stringify({ url }));
});
process.on("SIGTERM", () => process.exit(0));
