// Reads Baton's UI message streams with the AI SDK's own client code: the
// DefaultChatTransport of useChat (its request, its reconnect, its parse of
// the stream against the SDK's chunk schemas) and readUIMessageStream (how
// useChat folds chunks into a message). Prints what the client ends with,
// as JSON, for the Go test to judge.
//
// The approval scenario drives the SDK's Chat itself (useChat's core,
// without React): it sends the message, answers the approval the reply
// asks for with addToolApprovalResponse, and lets the Chat send that
// answer as useChat does (sendAutomaticallyWhen).
//
// The files scenarios send an image with the Chat's sendMessage({files}),
// as useChat does, then a second message (with files, the Chat resends
// the first message's data URL; with files-last, its transport sends only
// the new message, as the guide shows), read the chat's history back as
// an app loads it, and load each file part's link without a token, as
// <img> does.
//
//	node read.mjs <v6|v7> <reply|resume|stop|approval|files|files-last> <API root> <token> <chat id> <message id> <text> [approve|deny|<data URL>]
import * as v6 from "ai-v6";
import * as v7 from "ai-v7";

const [version, scenario, root, token, chatId, messageId, text, decision] = process.argv.slice(2);
const dataURL = decision;
const ai = { v6, v7 }[version];
// A scenario that waits for a stream that never ends fails instead.
setTimeout(() => {
  process.stderr.write(`${scenario}: no result after 120 s\n`);
  process.exit(2);
}, 120000).unref();
if (!ai) throw new Error(`unknown version ${version}: v6 or v7`);
const headers = { Authorization: `Bearer ${token}` };
const transport = new ai.DefaultChatTransport({ api: `${root}/v1/chat`, headers });

// read folds a stream of chunks into the message useChat would show,
// calling onDelta with the number of text deltas so far.
async function read(stream, onDelta) {
  let deltas = 0;
  const counted = stream.pipeThrough(new TransformStream({
    transform(chunk, controller) {
      controller.enqueue(chunk);
      if (chunk.type === "text-delta") onDelta?.(++deltas);
    },
  }));
  let last;
  for await (const message of ai.readUIMessageStream({ stream: counted, terminateOnError: true })) last = message;
  const parts = last?.parts ?? [];
  return {
    id: last?.id,
    text: parts.filter((p) => p.type === "text").map((p) => p.text).join(""),
    reasoning: parts.filter((p) => p.type === "reasoning").map((p) => p.text).join(""),
    parts: parts.map((p) => p.type),
    metadata: last?.metadata ?? null,
    deltas,
  };
}

function textOf(message) {
  return message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
}

// ChatState is the state a Chat keeps, as useChat's keeps it, without
// React.
class ChatState {
  messages = [];
  status = "ready";
  error = undefined;
  pushMessage = (m) => { this.messages = [...this.messages, m]; };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => { this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)]; };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends ai.AbstractChat {
  constructor(options) {
    super({ ...options, state: new ChatState() });
  }
}

function send() {
  return transport.sendMessages({
    chatId,
    messages: [{ id: messageId, role: "user", parts: [{ type: "text", text }] }],
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: new AbortController().signal,
  });
}

// whenDeltas resolves once the reply has streamed n text deltas.
function deltasGate(n) {
  let open;
  const opened = new Promise((resolve) => (open = resolve));
  return { opened, onDelta: (k) => k >= n && open() };
}

const out = {};
switch (scenario) {
  case "reply":
    out.reply = await read(await send());
    break;
  case "resume": {
    // A second client joins mid-reply through useChat's reconnect.
    const gate = deltasGate(5);
    const first = read(await send(), gate.onDelta);
    await gate.opened;
    const stream = await transport.reconnectToStream({ chatId });
    if (stream == null) throw new Error("reconnect answered 204 while the reply was running");
    [out.reply, out.resumed] = await Promise.all([first, read(stream)]);
    break;
  }
  case "stop": {
    // The app's Stop: the server stops the turn, the stream ends with
    // the reply so far.
    const gate = deltasGate(5);
    const reply = read(await send(), gate.onDelta);
    await gate.opened;
    const res = await fetch(`${root}/v1/conversations/${encodeURIComponent(chatId)}/stop`, { method: "POST", headers });
    if (!res.ok) throw new Error(`stop: HTTP ${res.status}`);
    out.reply = await reply;
    break;
  }
  case "approval": {
    const finished = [];
    let onFinished;
    const chat = new Chat({
      id: chatId,
      transport,
      sendAutomaticallyWhen: ai.lastAssistantMessageIsCompleteWithApprovalResponses,
      onFinish: () => {
        finished.push(true);
        onFinished?.();
      },
    });
    const requests = (n) => new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`after 60 s, ${finished.length} of ${n} requests ended; status ${chat.status}`)), 60000);
      onFinished = () => finished.length >= n && (clearTimeout(timer), resolve());
      onFinished();
    });
    await chat.sendMessage({ id: messageId, text });
    await requests(1);
    if (chat.error) throw chat.error;
    const asked = structuredClone(chat.messages.at(-1));
    const part = asked.parts.find((p) => p.state === "approval-requested");
    if (!part) throw new Error(`the reply asks for no approval: ${JSON.stringify(asked)}`);
    out.asked = { id: asked.id, text: textOf(asked), tool: part.toolName, input: part.input, approvalId: part.approval.id, type: part.type };
    await chat.addToolApprovalResponse({ id: part.approval.id, approved: decision === "approve" });
    await requests(2);
    if (chat.error) throw chat.error;
    const final = chat.messages.at(-1);
    const tools = final.parts.filter((p) => p.toolCallId != null);
    out.final = {
      id: final.id,
      text: textOf(final),
      messages: chat.messages.length,
      tools: tools.map((p) => ({ toolCallId: p.toolCallId, state: p.state, output: p.output ?? null })),
    };
    break;
  }
  case "files":
  case "files-last": {
    // docs/guides/use-chat.md, "Attachments": send only the new message.
    const lastOnly = new ai.DefaultChatTransport({
      api: `${root}/v1/chat`,
      headers,
      prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
        body: { id, messages: messages.slice(-1), trigger, messageId },
      }),
    });
    const finished = [];
    let onFinished;
    const chat = new Chat({
      id: chatId,
      transport: scenario === "files-last" ? lastOnly : transport,
      onFinish: () => {
        finished.push(true);
        onFinished?.();
      },
    });
    const requests = (n) => new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`after 60 s, ${finished.length} of ${n} requests ended; status ${chat.status}`)), 60000);
      onFinished = () => finished.length >= n && (clearTimeout(timer), resolve());
      onFinished();
    });
    await chat.sendMessage({ id: messageId, text, files: [{ type: "file", mediaType: "image/png", filename: "red square.png", url: dataURL }] });
    await requests(1);
    if (chat.error) throw chat.error;
    out.sent = chat.messages[0].parts.map((p) => p.type);
    out.first = textOf(chat.messages.at(-1));
    await chat.sendMessage({ id: `${messageId}-2`, text: "and once more" });
    await requests(2);
    if (chat.error) throw chat.error;
    out.second = textOf(chat.messages.at(-1));
    const res = await fetch(`${root}/v1/chat/${encodeURIComponent(chatId)}`, { headers });
    if (!res.ok) throw new Error(`history: HTTP ${res.status}`);
    const history = await res.json();
    out.files = [];
    for (const m of history.messages) {
      for (const p of m.parts) {
        if (p.type !== "file") continue;
        const r = await fetch(p.url); // no token, as <img> loads it
        const bytes = Buffer.from(await r.arrayBuffer());
        out.files.push({
          message: m.id, mediaType: p.mediaType, filename: p.filename, status: r.status,
          contentType: r.headers.get("content-type"), nosniff: r.headers.get("x-content-type-options"),
          same: bytes.toString("base64") === dataURL.split(",")[1],
        });
      }
    }
    break;
  }
  default:
    throw new Error(`unknown scenario ${scenario}`);
}
process.stdout.write(JSON.stringify(out) + "\n");
