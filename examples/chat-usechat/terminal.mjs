// Sends one message to a Baton chat from a terminal with the AI SDK's own
// client, the transport useChat uses (DefaultChatTransport), and reads the
// reply as useChat folds it (readUIMessageStream). It prints one JSON
// object a line: {"delta": "..."} for each piece of text as it arrives,
// then {"reply": {"id", "text", "metadata"}}, the reply as the chat ends
// with it.
//
//	BATON_API=http://127.0.0.1:8080 BATON_TOKEN=$(cat .baton/dev-token) node terminal.mjs <chat id> <message>
import { randomUUID } from "node:crypto";
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [chatId, text] = process.argv.slice(2);
const api = process.env.BATON_API ?? "http://127.0.0.1:8080";
const token = process.env.BATON_TOKEN;
if (!chatId || !text || !token) {
  process.stderr.write("usage: BATON_API=<API root> BATON_TOKEN=<token> node terminal.mjs <chat id> <message>\n");
  process.exit(2);
}

const transport = new DefaultChatTransport({ api: `${api}/v1/chat`, headers: { Authorization: `Bearer ${token}` } });
const stream = await transport.sendMessages({
  chatId,
  messages: [{ id: randomUUID(), role: "user", parts: [{ type: "text", text }] }],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
});
const print = (line) => process.stdout.write(JSON.stringify(line) + "\n");
const shown = stream.pipeThrough(
  new TransformStream({
    transform(chunk, controller) {
      if (chunk.type === "text-delta") print({ delta: chunk.delta });
      controller.enqueue(chunk);
    },
  }),
);
let last;
for await (const message of readUIMessageStream({ stream: shown, terminateOnError: true })) last = message;
const parts = last?.parts ?? [];
print({
  reply: {
    id: last?.id,
    text: parts.filter((p) => p.type === "text").map((p) => p.text).join(""),
    metadata: last?.metadata ?? null,
  },
});
