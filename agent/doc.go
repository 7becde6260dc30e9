// Package agent answers turns with a model server that speaks the OpenAI
// chat completions API (OpenAI itself, vLLM, Ollama, llama.cpp's server,
// LiteLLM), calling tools from a Registry through the turn runner's
// journal, and showing the reply live on NATS while the model writes it,
// with the model's reasoning where the server sends it (reasoning_content
// or reasoning), which is kept with the reply and never sent back.
//
// A tool is a protocol: a name, a version, a JSON Schema for its arguments
// and an effect (read or write). Arguments are validated before the tool
// runs; what the model got wrong goes back to the model, not to the user.
// Every call is journaled in operations by the turn runner, so recovery
// knows whether an interrupted attempt changed the world.
//
// The model edge: each failed call is classified by what another try would
// change (see ErrModelRefused and the sentinel errors beside it): terminal
// faults end the turn at once, with a text for the operator (Error) and one
// for the user (UserText); a rate limit or an overload ends the attempt with
// a *RateLimitError, whose RetryAfter the turn runner waits with the turn
// released; 5xx and lost connections are retried inside the attempt. A
// call is judged by its progress (Config.FirstByteTimeout,
// Config.IdleTimeout), not its length. Each request fits
// Config.ContextTokens, however long the conversation.
//
// External answers turns with an agent in another language served over
// HTTP (AG-UI, or the AI SDK's chat route): a step function that the turn
// runner drives, classified and retried the same way, each step posted
// with a stable identity (its run id and Idempotency-Key). The wire
// contract is docs/guides/agents.md.
package agent
