package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/respjson"
	"github.com/openai/openai-go/v3/shared"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/telemetry"
)

// OpenAI is a consumer.Agent that answers each step of a turn with one
// response of a model server speaking the OpenAI chat completions API: the
// conversation, the earlier steps with their tool results and the
// declared tools in, text and tool calls out. The turn runner's tool loop
// runs the calls and asks for the next step.
type OpenAI struct {
	cfg  Config
	chat openai.ChatCompletionService
	log  zerolog.Logger
}

var _ consumer.Agent = (*OpenAI)(nil)

// NewOpenAI checks the configuration and returns the agent.
func NewOpenAI(cfg Config) (*OpenAI, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The service is built from these options alone, not from the
	// client's OPENAI_* environment defaults: Baton's own settings are the
	// only configuration. The client's retries are off: the agent retries
	// itself, so that a retry is counted in the turn's budget, a long
	// Retry-After goes to the turn runner instead of being waited out, and
	// the live reply is reset.
	chat := openai.NewChatCompletionService(
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(0),
	)
	// The caller's logger names the component (the worker's says
	// component=agent): adding it here would repeat the key.
	return &OpenAI{cfg: cfg, chat: chat, log: cfg.Logger.With().Str("model", cfg.Model).Logger()}, nil
}

// Step answers one step with one model response, retried inside the step
// for what may pass soon (see step). The request holds as much of the
// conversation as fits ContextTokens, the turn's earlier steps with their
// tool results, and the declared tools. An answer the model cut off at its
// output limit comes back with Truncated set.
func (a *OpenAI) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	turn := req.Turn
	t := &stepCall{
		OpenAI: a, live: req.Live, attempt: max(turn.Attempt, 1),
		log: a.log.With().Str("conversation_id", turn.ConversationID).Str("run_id", turn.RunID).Str("turn_id", turn.TurnID).Logger(),
	}
	for _, s := range req.Steps {
		t.calls += s.Requests
	}
	made := t.calls
	toolParams := toolParamsOf(req.Tools)
	w := newWindow(a.cfg, *turn, toolParams)
	for _, s := range req.Steps {
		w.addRound(s.Text, modelCalls(s.Calls), modelResults(s.Results))
	}
	r, err := w.next(ctx)
	if err != nil {
		return consumer.Step{}, err
	}
	t.log.Debug().Int("round", req.Index+1).Int("messages", len(r.messages)).Int("history_messages", r.history).
		Int("estimated_tokens", r.tokens).Bool("trimmed", r.trimmed).Msg("model request")
	st, err := t.step(ctx, openai.ChatCompletionNewParams{Model: a.cfg.Model, Messages: r.messages, Tools: toolParams})
	out := consumer.Step{Text: st.content, Reasoning: st.reasoning, Requests: t.calls - made}
	if err != nil {
		return out, err
	}
	for _, c := range st.calls {
		out.Calls = append(out.Calls, consumer.ToolCall{ID: c.ID, Tool: c.Name, Arguments: json.RawMessage(c.Arguments)})
	}
	nothingYet := st.content == "" && req.ReplySoFar() == ""
	switch {
	case st.finish == "content_filter":
		return out, &ModelError{Kind: ErrContentFiltered, User: userFiltered, Message: `the model stopped its answer for its content filter (finish reason "content_filter"); another attempt would be filtered too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)`}
	case st.finish == "length" && nothingYet:
		return out, &ModelError{Kind: ErrTruncated, User: userTruncated, Message: fmt.Sprintf(`the model reached its output limit (finish reason "length") before it wrote any text%s: raise the model server's output token limit, or lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens) to leave more of the context window for the answer`, callsNote(len(st.calls)))}
	case st.finish == "length":
		// Cut off at the output limit: the text so far is the reply,
		// marked as such. Tool calls of the step may be cut in half:
		// none of them runs.
		out.Truncated = true
	case len(st.calls) == 0 && nothingYet:
		return out, &ModelError{Kind: ErrEmptyReply, User: userEmpty, Message: fmt.Sprintf("the model returned an empty answer (finish reason %q, no text, no tool call); another attempt would likely do the same: check that model %q (BATON_MODEL, --model) is a chat model", st.finish, a.cfg.Model)}
	}
	return out, nil
}

// stepCall is the state of one step's model call and its retries.
type stepCall struct {
	*OpenAI
	log  zerolog.Logger
	live consumer.StepLive
	// attempt is the turn's attempt, from 1.
	attempt int
	// calls counts the turn's model calls, retries included.
	calls int
}

// toolParamsOf declares tools as a chat completions request does.
func toolParamsOf(specs []consumer.ToolSpec) []openai.ChatCompletionToolUnionParam {
	var out []openai.ChatCompletionToolUnionParam
	for _, s := range specs {
		var params map[string]any
		_ = json.Unmarshal(s.Schema, &params)
		fn := shared.FunctionDefinitionParam{Name: s.Name, Parameters: shared.FunctionParameters(params)}
		if s.Description != "" {
			fn.Description = openai.String(s.Description)
		}
		out = append(out, openai.ChatCompletionFunctionTool(fn))
	}
	return out
}

// modelCalls are a step's calls as the model wrote them.
func modelCalls(calls []consumer.ToolCall) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i] = toolCall{ID: c.ID, Name: c.Tool, Arguments: string(c.Arguments)}
	}
	return out
}

// modelResults are a step's results as the model reads them: a call that
// failed or was not made reads "error: " and why.
func modelResults(results []consumer.ToolResult) []string {
	out := make([]string, len(results))
	for i, r := range results {
		out[i] = r.Output
		if r.Error != "" {
			out[i] = "error: " + r.Error
		}
	}
	return out
}

// callsNote says how many tool calls a cut-off step left unrun.
func callsNote(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return " (it was writing a tool call, which did not run)"
	}
	return fmt.Sprintf(" (it was writing %d tool calls, which did not run)", n)
}

// stepResult is one model response.
type stepResult struct {
	content string
	// reasoning is what the model thought before it answered, when the
	// server sends it (see reasoningOf).
	reasoning string
	calls     []toolCall
	finish    string
}

// reasoningFields are the fields in which model servers send a model's
// reasoning beside its content, in a streamed chunk's delta or a whole
// response's message, in the order they are read: reasoning_content
// (DeepSeek, vLLM, llama.cpp, SGLang) and reasoning (OpenRouter, newer
// vLLM, Ollama). The chat completions API has neither, so the library
// keeps them as extra fields.
var reasoningFields = []string{"reasoning_content", "reasoning"}

// reasoningOf is the reasoning a delta or message carries in one of
// reasoningFields, or "". It is shown and kept with the reply, and never
// sent back to the model: the requests of later steps hold each step's
// content and tool calls only.
func reasoningOf(extra map[string]respjson.Field) string {
	for _, name := range reasoningFields {
		// The library marks an extra field neither valid nor null: it
		// has no type to check it against. Its raw JSON says what it is.
		var s string
		if f, ok := extra[name]; ok && json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// step calls the model once, retrying inside the attempt what may pass
// soon: a 5xx or a lost connection with backoff, a rate limit whose
// Retry-After is at most MaxInlineRetryAfter, and one malformed answer.
// A longer wait ends the attempt with a *RateLimitError at once, so the
// turn runner schedules the next attempt instead of holding the lease.
func (t *stepCall) step(ctx context.Context, params openai.ChatCompletionNewParams) (stepResult, error) {
	var failed, malformed int
	var last *failure
	for {
		if t.calls >= t.cfg.MaxModelCalls {
			msg := fmt.Sprintf("the turn made all %d model calls it may make (BATON_MAX_MODEL_CALLS, --max-model-calls)", t.cfg.MaxModelCalls)
			if last != nil {
				msg += "; the last one failed: " + last.what
			}
			return stepResult{}, &ModelError{Kind: ErrBudgetExceeded, User: userModelCalls, Message: msg}
		}
		t.calls++
		st, err := t.call(ctx, params)
		if err == nil {
			return st, nil
		}
		if ctx.Err() != nil {
			return stepResult{}, context.Cause(ctx)
		}
		var f *failure
		if !errors.As(err, &f) {
			return stepResult{}, err
		}
		failed++
		last = f
		retries := max(t.cfg.MaxRetries, 0)
		var wait time.Duration
		switch f.fault {
		case faultTerminal, faultTimeout:
			return stepResult{}, f.err
		case faultMalformed:
			malformed++
			if malformed > min(retries, 1) {
				return stepResult{}, t.malformed(f, failed)
			}
			wait = backoff(0, t.cfg.RetryBaseDelay, t.cfg.MaxRetryDelay)
		default:
			switch {
			case f.hasRetryAfter && f.retryAfter > t.cfg.MaxInlineRetryAfter,
				f.fault == faultRateLimit && (!f.hasRetryAfter || failed > retries):
				return stepResult{}, t.rateLimited(f, failed)
			case failed > retries:
				return stepResult{}, t.unavailable(f, failed)
			case f.hasRetryAfter:
				wait = f.retryAfter
			default:
				wait = backoff(failed-1, t.cfg.RetryBaseDelay, t.cfg.MaxRetryDelay)
			}
		}
		t.live.Retry()
		t.log.Warn().Str("failure", f.what).Int("status_code", f.status).Int("retry", failed).Dur("wait", wait).Msg("model call failed; retrying")
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return stepResult{}, context.Cause(ctx)
		case <-timer.C:
		}
	}
}

// calls is "1 call" or "n calls in a row".
func calls(n int) string {
	if n == 1 {
		return "1 call"
	}
	return fmt.Sprintf("%d calls in a row", n)
}

func (t *stepCall) rateLimited(f *failure, n int) *RateLimitError {
	var wait time.Duration
	var asked string
	switch {
	case f.hasRetryAfter && f.retryAfter > MaxRetryAfter:
		wait = MaxRetryAfter
		asked = fmt.Sprintf("asked to wait %s, more than the %s a turn waits: the turn is to be tried again in %s", f.retryAfter, MaxRetryAfter, wait)
	case f.hasRetryAfter:
		wait = f.retryAfter.Round(time.Millisecond)
		asked = fmt.Sprintf("asked to wait %s: the turn is to be tried again after that", wait)
	default:
		wait = backoff(t.attempt-1, t.cfg.RateLimitDelay, t.cfg.MaxRetryDelay).Round(time.Millisecond)
		asked = fmt.Sprintf("sent no Retry-After: the turn is to be tried again in %s (backoff for attempt %d)", wait, t.attempt)
	}
	return &RateLimitError{After: wait, ModelError: &ModelError{
		Kind: ErrRateLimited, StatusCode: f.status, User: userBusy, Cause: f.cause,
		Message: fmt.Sprintf("the model server is busy (%s, on %s in this attempt) and %s; if this persists, check the limits of the key in BATON_MODEL_API_KEY (--model-api-key) and the capacity of the server at BATON_MODEL_BASE_URL (--model-base-url)", f.what, calls(n), asked),
	}}
}

func (t *stepCall) unavailable(f *failure, n int) *ModelError {
	return &ModelError{
		Kind: ErrModelUnavailable, StatusCode: f.status, User: userUnavailable, Cause: f.cause,
		Message: fmt.Sprintf("the model server failed on %s in this attempt (last: %s): check that it is up and not overloaded at BATON_MODEL_BASE_URL (--model-base-url)", calls(n), f.what),
	}
}

func (t *stepCall) malformed(f *failure, n int) *ModelError {
	fix := "check that BATON_MODEL_BASE_URL (--model-base-url) is the API root of an OpenAI-compatible server"
	if !t.cfg.DisableStreaming {
		fix += ", or set --model-streaming=false (BATON_MODEL_STREAMING=false) if it cannot stream"
	}
	return &ModelError{
		Kind: ErrMalformedResponse, User: userMalformed, Cause: f.cause,
		Message: fmt.Sprintf("the model server's answers are not chat completions (%s; last: %s): %s", calls(n), f.what, fix),
	}
}

// call makes one request, streamed unless DisableStreaming, judged by its
// progress (see watch) and capped at RequestTimeout. A failure comes back
// as a *failure, or as the turn's own context error.
func (t *stepCall) call(ctx context.Context, params openai.ChatCompletionNewParams) (st stepResult, err error) {
	// One span per request, retries included, named and described by the
	// OpenTelemetry conventions for generative AI; never the content.
	ctx, span := telemetry.Tracer().Start(ctx, "chat "+t.cfg.Model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.request.model", t.cfg.Model),
			attribute.Int("baton.model_call", t.calls),
			attribute.Int("baton.attempt", t.attempt),
			attribute.Bool("baton.streaming", !t.cfg.DisableStreaming),
		))
	defer func() {
		if err != nil {
			var f *failure
			if errors.As(err, &f) {
				span.SetStatus(codes.Error, f.what)
				if f.status != 0 {
					span.SetAttributes(attribute.Int("http.response.status_code", f.status))
				}
			} else {
				span.SetStatus(codes.Error, err.Error())
			}
		} else {
			span.SetAttributes(
				attribute.StringSlice("gen_ai.response.finish_reasons", []string{st.finish}),
				attribute.Int("baton.tool_calls", len(st.calls)))
		}
		span.End()
	}()
	capCtx, stopCap := context.WithTimeoutCause(ctx, t.cfg.RequestTimeout, &timeoutError{what: "cap", after: t.cfg.RequestTimeout})
	defer stopCap()
	callCtx, cancel := context.WithCancelCause(capCtx)
	defer cancel(nil)
	w := newWatch(t.cfg.FirstByteTimeout, t.cfg.IdleTimeout, !t.cfg.DisableStreaming, cancel)
	defer w.stop()
	if t.cfg.DisableStreaming {
		st, err = t.whole(callCtx, params, w.option())
	} else {
		st, err = t.stream(callCtx, params, w.option())
	}
	switch {
	case err == nil:
		return st, nil
	case ctx.Err() != nil:
		return st, context.Cause(ctx)
	}
	return st, t.classify(err, context.Cause(callCtx))
}

func (t *stepCall) whole(ctx context.Context, params openai.ChatCompletionNewParams, opt option.RequestOption) (stepResult, error) {
	comp, err := t.chat.New(ctx, params, opt)
	if err != nil {
		return stepResult{}, err
	}
	if len(comp.Choices) == 0 {
		return stepResult{}, errNoChoices
	}
	ch := comp.Choices[0]
	st := stepResult{content: ch.Message.Content, reasoning: reasoningOf(ch.Message.JSON.ExtraFields), finish: ch.FinishReason}
	if st.content == "" {
		st.content = ch.Message.Refusal
	}
	// Tool calls count whatever the finish reason says: several servers
	// send them with "stop".
	for _, c := range ch.Message.ToolCalls {
		st.calls = append(st.calls, toolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return st, nil
}

func (t *stepCall) stream(ctx context.Context, params openai.ChatCompletionNewParams, opt option.RequestOption) (stepResult, error) {
	s := t.chat.NewStreaming(ctx, params, opt)
	defer s.Close()
	var st stepResult
	var content, reasoning strings.Builder
	var calls toolCalls
	for s.Next() {
		for _, ch := range s.Current().Choices {
			if ch.Index != 0 {
				continue
			}
			if thought := reasoningOf(ch.Delta.JSON.ExtraFields); thought != "" {
				t.live.Reasoning(thought)
				reasoning.WriteString(thought)
			}
			text := ch.Delta.Content
			if text == "" {
				text = ch.Delta.Refusal
			}
			if text != "" {
				t.live.Text(text)
				content.WriteString(text)
			}
			for _, d := range ch.Delta.ToolCalls {
				calls.add(d)
			}
			if ch.FinishReason != "" {
				st.finish = ch.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		return stepResult{}, err
	}
	if st.finish == "" {
		// The connection ended before the model did.
		return stepResult{}, errIncomplete
	}
	st.content = content.String()
	st.reasoning = reasoning.String()
	st.calls = calls.list()
	return st, nil
}

var (
	errNoChoices  = errors.New("the response has no choices")
	errIncomplete = errors.New("the streamed response ended without a finish reason")
)
