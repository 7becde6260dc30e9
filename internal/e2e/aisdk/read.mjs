// Reads Baton's UI message streams with the AI SDK's own client code: the
// DefaultChatTransport of useChat (its request, its reconnect, its parse of
// the stream against the SDK's chunk schemas) and readUIMessageStream (how
// useChat folds chunks into a message). Prints what the client ends with,
// as JSON, for the Go test to judge.
//
//	node read.mjs <v6|v7> <reply|resume|stop> <API root> <token> <chat id> <message id> <text>
import * as v6 from "ai-v6";
import * as v7 from "ai-v7";

const [version, scenario, root, token, chatId, messageId, text] = process.argv.slice(2);
const ai = { v6, v7 }[version];
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
  return {
    id: last?.id,
    text: (last?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join(""),
    metadata: last?.metadata ?? null,
    deltas,
  };
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
  default:
    throw new Error(`unknown scenario ${scenario}`);
}
process.stdout.write(JSON.stringify(out) + "\n");
