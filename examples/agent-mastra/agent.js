// The agent: a Mastra agent (@mastra/core) whose model is scripted
// (model.js), run over AG-UI by @ag-ui/mastra. One AG-UI run is one step
// of a Baton turn: the adapter hands Mastra the messages Baton sends (the
// conversation, then this turn's earlier steps: an assistant message with
// its toolCalls and a tool message per result) and declares Baton's tools
// to it as client tools, which Mastra never runs: a call of one ends the
// run after TOOL_CALL_END, and Baton runs it, journaled, and posts the
// next step with its result.
import { MastraAgent } from "@ag-ui/mastra";
import { Agent } from "@mastra/core/agent";
import { scriptedModel } from "./model.js";

// mastraAgent is the Mastra agent every run uses. It keeps no memory: the
// history comes with each step, so any worker may post any step.
export function mastraAgent({ slowDelayMs }) {
  return new Agent({
    id: "baton-example",
    name: "Baton example",
    instructions: "Answer the user. Call the tools you are given when the user asks for them.",
    model: scriptedModel({ slowDelayMs }),
  });
}

// run yields the AG-UI events of one run of input (a RunAgentInput), as
// @ag-ui/mastra emits them: RUN_STARTED, the reply's text as
// TEXT_MESSAGE_CHUNK events (Mastra sends no TEXT_MESSAGE_START/END), or
// a declared tool's TOOL_CALL_START/ARGS/END, then RUN_FINISHED. When
// signal aborts, the run is abandoned: the adapter's abortRun() is called
// and no further event is yielded.
export async function* run(agent, input, { user, signal }) {
  // The adapter keeps a run's state on its instance: one per run.
  const adapter = new MastraAgent({ agent, resourceId: user });
  const queue = [];
  let wake = () => {};
  let finished = false;
  let failure;
  const subscription = adapter.run(input).subscribe({
    next: (event) => {
      queue.push(event);
      wake();
    },
    error: (err) => {
      failure = err;
      finished = true;
      wake();
    },
    complete: () => {
      finished = true;
      wake();
    },
  });
  const stop = () => {
    subscription.unsubscribe();
    adapter.abortRun();
    finished = true;
    wake();
  };
  signal.addEventListener("abort", stop, { once: true });
  try {
    while (true) {
      if (queue.length > 0) {
        if (signal.aborted) return;
        yield queue.shift();
        continue;
      }
      if (finished) break;
      await new Promise((resolve) => {
        wake = resolve;
      });
    }
    if (failure && !signal.aborted) throw failure;
  } finally {
    signal.removeEventListener("abort", stop);
    subscription.unsubscribe();
  }
}
