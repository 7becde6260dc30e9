// Package agent answers turns with a model server that speaks the OpenAI
// chat completions API (OpenAI itself, vLLM, Ollama, llama.cpp's server,
// LiteLLM), calling tools from a Registry through the turn runner's
// journal, and showing the reply live on NATS while the model writes it.
//
// A tool is a protocol: a name, a version, a JSON Schema for its arguments
// and an effect (read or write). Arguments are validated before the tool
// runs; what the model got wrong goes back to the model, not to the user.
// Every call is journaled in operations by the turn runner, so recovery
// knows whether an interrupted attempt changed the world.
package agent
