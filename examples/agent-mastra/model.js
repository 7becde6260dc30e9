// The Mastra agent's model: the AI SDK's mock language model, scripted
// from the conversation, so that the agent answers the same way every time
// without a model server. Mastra takes the AI SDK's models as they are: put
// a provider's model in its place (see README.md) and nothing else changes.
//
// The script, read from the last user message and what this turn's
// earlier steps brought back:
//   - once a tool's result is in the messages: a text that names it;
//   - "open a ticket: <text>": a call of the webhook tool Baton declares,
//     with {"payload": {"ticket": "<text>"}};
//   - "call <tool> <JSON>": a call of that declared tool with the JSON;
//   - "think slowly" anywhere in the message: the text (the answer after a
//     tool, or a long one of its own) word by word, a pause between words;
//   - anything else: "You said: <message>", in a few chunks.
import { setTimeout as sleep } from "node:timers/promises";
import { MockLanguageModelV4 } from "ai/test";

export function scriptedModel({ slowDelayMs }) {
  return new MockLanguageModelV4({
    provider: "baton-example",
    modelId: "scripted",
    doStream: async ({ prompt, tools, abortSignal }) => ({
      stream: streamOf(partsOf(plan(prompt, tools ?? []), slowDelayMs), abortSignal),
    }),
  });
}

// plan decides the step: {text, slow} or {call: {tool, input}}.
export function plan(prompt, tools) {
  const last = prompt.findLastIndex((m) => m.role === "user");
  const ask = last < 0 ? "" : prompt[last].content.filter((p) => p.type === "text").map((p) => p.text).join("");
  const results = prompt
    .slice(last + 1)
    .filter((m) => m.role === "tool")
    .flatMap((m) => m.content)
    .filter((p) => p.type === "tool-result");
  const slow = /think slowly/i.test(ask);
  const declared = new Set(tools.map((t) => t.name));

  if (results.length > 0) {
    const done = `Done: ${results.map((r) => `${r.toolName} answered ${outputText(r.output)}`).join("; ")}.`;
    return { text: slow ? `Let me think that over slowly, one word at a time. ${done}` : done, slow };
  }
  const ticket = /open a ticket:\s*(.+)/i.exec(ask);
  if (ticket) {
    if (!declared.has("webhook")) return { text: "I cannot open tickets here: no webhook tool is declared." };
    return { call: { tool: "webhook", input: { payload: { ticket: ticket[1].trim() } } } };
  }
  const call = /^call (\S+) (\{.*\})\s*$/s.exec(ask);
  if (call) {
    if (!declared.has(call[1])) return { text: `There is no tool ${call[1]} here.` };
    try {
      return { call: { tool: call[1], input: JSON.parse(call[2]) } };
    } catch {
      return { text: `The arguments for ${call[1]} are not JSON.` };
    }
  }
  if (slow) {
    return {
      text: `Let me think about that slowly, one word at a time, so that the reply takes a while to arrive and can be stopped halfway through. Having thought it over, here is my answer: you said "${ask}". That is all.`,
      slow,
    };
  }
  return { text: `You said: ${ask}` };
}

// outputText is a tool result's output as text.
function outputText(output) {
  const value = typeof output?.value === "string" ? output.value : JSON.stringify(output?.value ?? output?.reason ?? null);
  return output?.type?.startsWith("error") || output?.type === "execution-denied" ? `an error: ${value}` : value;
}

const usage = {
  inputTokens: { total: 0, noCache: 0, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 0, text: 0, reasoning: 0 },
};

// partsOf is the step as the model's stream parts, each with the pause
// before it.
function partsOf(step, slowDelayMs) {
  const parts = [{ part: { type: "stream-start", warnings: [] } }];
  if (step.call) {
    const id = `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
    const input = JSON.stringify(step.call.input);
    const half = Math.ceil(input.length / 2);
    parts.push(
      { part: { type: "tool-input-start", id, toolName: step.call.tool } },
      { part: { type: "tool-input-delta", id, delta: input.slice(0, half) } },
      { part: { type: "tool-input-delta", id, delta: input.slice(half) } },
      { part: { type: "tool-input-end", id } },
      { part: { type: "tool-call", toolCallId: id, toolName: step.call.tool, input } },
      { part: { type: "finish", finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage } },
    );
    return parts;
  }
  const words = step.text.match(/\S+\s*/g) ?? [step.text];
  const chunks = step.slow ? words : thirds(words);
  parts.push({ part: { type: "text-start", id: "text-1" } });
  for (const [i, delta] of chunks.entries()) {
    parts.push({ part: { type: "text-delta", id: "text-1", delta }, pause: step.slow && i > 0 ? slowDelayMs : 0 });
  }
  parts.push(
    { part: { type: "text-end", id: "text-1" } },
    { part: { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage } },
  );
  return parts;
}

// thirds joins words into at most three chunks.
function thirds(words) {
  const size = Math.ceil(words.length / 3);
  const out = [];
  for (let i = 0; i < words.length; i += size) out.push(words.slice(i, i + size).join(""));
  return out;
}

// streamOf streams the parts, pausing before those that ask for it, and
// stops at once when the request is aborted (the client went away).
function streamOf(parts, abortSignal) {
  let i = 0;
  return new ReadableStream({
    async pull(controller) {
      if (i >= parts.length) {
        controller.close();
        return;
      }
      const { part, pause } = parts[i++];
      if (pause) await sleep(pause, undefined, { signal: abortSignal });
      controller.enqueue(part);
    },
  });
}
