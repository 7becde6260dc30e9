// The agent: one run is one step of a Baton turn. It reads the messages
// Baton sends (the conversation, then this turn's earlier steps: an
// assistant message with its toolCalls and a tool message per result),
// decides, and yields AG-UI events: RUN_STARTED, then either the text of a
// reply (TEXT_MESSAGE_START, CONTENT, END) or a call of a tool Baton
// declared (TOOL_CALL_START, ARGS, END, and no TOOL_CALL_RESULT: Baton
// runs the call and posts the next step with its result), then
// RUN_FINISHED.
//
// The decision is scripted, in place of a model, so that the agent answers
// the same way every time. Read from the last user message and the
// results after it:
//   - once a tool's result is in the messages: a text that names it;
//   - "open a ticket: <text>": a call of the webhook tool Baton declares,
//     with {"payload": {"ticket": "<text>"}};
//   - "call <tool> <JSON>": a call of that declared tool with the JSON;
//   - "think slowly" anywhere in the message: the text (the answer after a
//     tool, or a long one of its own) word by word, a pause between words;
//   - anything else: "You said: <message>", in a few chunks.
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { EventType } from "@ag-ui/core";

// run yields the events of one run of input (a RunAgentInput). It stops
// at once, between events or in a pause, when signal aborts.
export async function* run(input, { slowDelayMs, signal }) {
  const { threadId, runId } = input;
  yield { type: EventType.RUN_STARTED, threadId, runId };
  const step = plan(input.messages, input.tools);
  if (step.call) {
    const toolCallId = `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`;
    const args = JSON.stringify(step.call.input);
    const half = Math.ceil(args.length / 2);
    yield { type: EventType.TOOL_CALL_START, toolCallId, toolCallName: step.call.tool };
    yield { type: EventType.TOOL_CALL_ARGS, toolCallId, delta: args.slice(0, half) };
    yield { type: EventType.TOOL_CALL_ARGS, toolCallId, delta: args.slice(half) };
    yield { type: EventType.TOOL_CALL_END, toolCallId };
  } else {
    const messageId = `msg_${randomUUID()}`;
    const words = step.text.match(/\S+\s*/g) ?? [step.text];
    yield { type: EventType.TEXT_MESSAGE_START, messageId, role: "assistant" };
    for (const [i, delta] of (step.slow ? words : thirds(words)).entries()) {
      if (step.slow && i > 0) await sleep(slowDelayMs, undefined, { signal });
      yield { type: EventType.TEXT_MESSAGE_CONTENT, messageId, delta };
    }
    yield { type: EventType.TEXT_MESSAGE_END, messageId };
  }
  yield { type: EventType.RUN_FINISHED, threadId, runId };
}

// plan decides the step: {text, slow} or {call: {tool, input}}.
export function plan(messages, tools) {
  const last = messages.findLastIndex((m) => m.role === "user");
  const ask = last < 0 ? "" : textOf(messages[last].content);
  const after = messages.slice(last + 1);
  const names = new Map(after.flatMap((m) => m.toolCalls ?? []).map((c) => [c.id, c.function.name]));
  const results = after.filter((m) => m.role === "tool");
  const slow = /think slowly/i.test(ask);
  const declared = new Set(tools.map((t) => t.name));

  if (results.length > 0) {
    const said = results.map((r) => `${names.get(r.toolCallId) ?? "a tool"} answered ${r.error ? `an error: ${r.error}` : r.content}`);
    const done = `Done: ${said.join("; ")}.`;
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

// textOf is a message's content as text: AG-UI content is a string, or
// parts of which the text ones count.
function textOf(content) {
  if (typeof content === "string") return content;
  return (content ?? []).filter((p) => p.type === "text").map((p) => p.text).join("");
}

// thirds joins words into at most three chunks.
function thirds(words) {
  const size = Math.ceil(words.length / 3);
  const out = [];
  for (let i = 0; i < words.length; i += size) out.push(words.slice(i, i + size).join(""));
  return out;
}
