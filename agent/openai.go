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
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
)

// OpenAI is a consumer.Agent that answers with a model server speaking
// the OpenAI chat completions API. A turn is a loop: call the model with
// the conversation and the tools; run the tool calls it asks for through
// the turn runner's journal; call it again with their results; stop when
// it answers without tool calls.
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

// Run answers one turn. The reply is the text of every model step, one
// paragraph each; it is also what the live events of the run add up to.
// A reply the model cut off at its output limit comes back with Truncated
// set.
func (a *OpenAI) Run(ctx context.Context, turn consumer.Turn, tools consumer.ToolExecutor) (consumer.Reply, error) {
	log := a.log.With().Str("conversation_id", turn.ConversationID).Str("run_id", turn.RunID).Str("turn_id", turn.TurnID).Logger()
	lv := newLive(a.cfg.Live, turn.ConversationID, turn.RunID, log)
	if turn.Live != nil {
		lv.show = turn.Live.Show
	}
	if turn.Attempt > 1 {
		// Subscribers of the conversation drop what an earlier attempt
		// showed.
		lv.publish(batonnats.DeltaReset, "")
	}
	reg := a.cfg.Tools
	if turn.Tools != nil {
		// The tools listed for this turn (an MCP server's among them).
		reg = registryOf(turn.Tools)
	}
	toolParams := reg.params()
	t := &turnLoop{
		OpenAI: a, log: log, live: lv, tools: tools, reg: reg, ids: map[string]bool{},
		attempt: max(turn.Attempt, 1), toolParams: toolParams,
		window: newWindow(a.cfg, turn, toolParams),
		resume: turn.Resume,
	}
	reply, err := t.run(ctx)
	var suspended *consumer.Suspended
	if errors.As(err, &suspended) {
		// What this run showed comes back when the turn resumes.
		lv.failed()
		return consumer.Reply{}, err
	}
	if err != nil {
		if !errors.Is(err, consumer.ErrStopped) {
			// A stopped turn keeps what it showed: that is its reply.
			lv.failed()
		}
		return consumer.Reply{}, err
	}
	lv.done()
	return reply, nil
}

// turnLoop is the state of one turn.
type turnLoop struct {
	*OpenAI
	log   zerolog.Logger
	live  *live
	tools consumer.ToolExecutor
	// attempt is the turn's attempt, from 1.
	attempt    int
	toolParams []openai.ChatCompletionToolUnionParam
	window     *window
	// calls counts model calls, retries included.
	calls int
	// ids are the tool call IDs given to the journal in this run.
	ids map[string]bool
	// reg is the turn's tools.
	reg *Registry
	// resume is the approval the turn resumes from, until its call was
	// answered.
	resume *consumer.Resume
	// rounds are the turn's tool rounds so far, as a suspension keeps them.
	rounds []savedRound
}

func (t *turnLoop) run(ctx context.Context) (consumer.Reply, error) {
	round := 0
	if t.resume != nil {
		step, err := t.restore()
		if err != nil {
			return consumer.Reply{}, err
		}
		if err := t.finishStep(ctx, step.Round, step.Content, step.Calls, step.Results); err != nil {
			return consumer.Reply{}, err
		}
		round = step.Round + 1
	}
	for ; ; round++ {
		req, err := t.window.next(ctx)
		if err != nil {
			return consumer.Reply{}, err
		}
		t.log.Debug().Int("round", round+1).Int("messages", len(req.messages)).Int("history_messages", req.history).
			Int("estimated_tokens", req.tokens).Bool("trimmed", req.trimmed).Msg("model request")
		params := openai.ChatCompletionNewParams{Model: t.cfg.Model, Messages: req.messages, Tools: t.toolParams}
		st, err := t.step(ctx, params)
		if err != nil {
			return consumer.Reply{}, err
		}
		switch st.finish {
		case "content_filter":
			return consumer.Reply{}, &ModelError{Kind: ErrContentFiltered, User: userFiltered, Message: `the model stopped its answer for its content filter (finish reason "content_filter"); another attempt would be filtered too: if this happens often, check the system prompt (BATON_SYSTEM_PROMPT, --system-prompt)`}
		case "length":
			// Cut off at the output limit: the text so far is the reply,
			// marked as such. Tool calls of the step may be cut in half:
			// none of them runs.
			t.live.commit(st.content)
			if t.live.text() == "" {
				return consumer.Reply{}, &ModelError{Kind: ErrTruncated, User: userTruncated, Message: fmt.Sprintf(`the model reached its output limit (finish reason "length") before it wrote any text%s: raise the model server's output token limit, or lower BATON_MODEL_CONTEXT_TOKENS (--model-context-tokens) to leave more of the context window for the answer`, callsNote(len(st.calls)))}
			}
			t.log.Info().Int("tool_calls_dropped", len(st.calls)).Msg("reply cut off at the model's output limit")
			return consumer.Reply{Content: t.live.text(), Truncated: true}, nil
		}
		t.live.commit(st.content)
		if len(st.calls) == 0 {
			if t.live.text() == "" {
				return consumer.Reply{}, &ModelError{Kind: ErrEmptyReply, User: userEmpty, Message: fmt.Sprintf("the model returned an empty answer (finish reason %q, no text, no tool call); another attempt would likely do the same: check that model %q (BATON_MODEL, --model) is a chat model", st.finish, t.cfg.Model)}
			}
			return consumer.Reply{Content: t.live.text()}, nil
		}
		if round >= t.cfg.MaxToolIterations {
			return consumer.Reply{}, &ModelError{Kind: ErrBudgetExceeded, User: userToolRounds, Message: fmt.Sprintf("the model was still calling tools after %d rounds, the most a turn may use (BATON_MAX_TOOL_ITERATIONS, --max-tool-iterations): raise it if turns need more", t.cfg.MaxToolIterations)}
		}
		calls := t.identify(round, st.calls)
		if err := t.finishStep(ctx, round, st.content, calls, nil); err != nil {
			return consumer.Reply{}, err
		}
	}
}

// finishStep runs the calls of a step that have no result yet, in order,
// and adds the step to the window. A call that waits for a person's
// approval stops the turn there (*consumer.Suspended), with what it needs
// to go on from that call.
func (t *turnLoop) finishStep(ctx context.Context, round int, content string, calls []toolCall, results []string) error {
	for i := len(results); i < len(calls); i++ {
		out, err := t.callTool(ctx, calls[i])
		if errors.Is(err, consumer.ErrNeedsApproval) {
			return t.suspend(savedRound{Round: round, Content: content, Calls: calls, Results: results})
		}
		if err != nil {
			return err
		}
		results = append(results, out)
	}
	t.window.addRound(content, calls, results)
	t.rounds = append(t.rounds, savedRound{Round: round, Content: content, Calls: calls, Results: results})
	return nil
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

// identify gives each call of a step an ID that is unique in the run,
// which the journal requires and from which a write's idempotency key is
// derived. Servers that give no ID, or the same ones each round, get
// deterministic ones.
func (t *turnLoop) identify(round int, calls []toolCall) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		if c.ID == "" || t.ids[c.ID] {
			c.ID = fmt.Sprintf("call_r%d_%d", round+1, i+1)
			for n := 2; t.ids[c.ID]; n++ {
				c.ID = fmt.Sprintf("call_r%d_%d_%d", round+1, i+1, n)
			}
		}
		t.ids[c.ID] = true
		out[i] = c
	}
	return out
}

// callTool runs one call and returns what the model gets back. A call the
// model got wrong (unknown tool, broken or invalid arguments) and a
// tool's own failure are answers for the model; only an error of the
// journal (lost lease, deleted conversation, database) ends the turn.
func (t *turnLoop) callTool(ctx context.Context, c toolCall) (string, error) {
	log := t.log.With().Str("tool", c.Name).Str("tool_call_id", c.ID).Logger()
	args := strings.TrimSpace(c.Arguments)
	if args == "" {
		args = "{}"
	}
	if t.resume != nil && c.ID == t.resume.ToolCallID {
		// The call a person decided on: the journal answers it by the
		// decision, with the arguments it stored.
		t.resume = nil
	} else {
		tool, ok := t.reg.lookup(c.Name)
		if !ok {
			log.Info().Msg("model called an unknown tool")
			return fmt.Sprintf("error: there is no tool %q; the tools are: %s", c.Name, strings.Join(t.reg.Names(), ", ")), nil
		}
		if err := tool.validate(json.RawMessage(args)); err != nil {
			log.Info().Err(err).Msg("model called a tool with invalid arguments")
			return "error: " + err.Error(), nil
		}
	}
	out, err := t.tools.Call(ctx, consumer.ToolCall{ID: c.ID, Tool: c.Name, Arguments: json.RawMessage(args)})
	var te *ToolError
	var denied *consumer.DeniedError
	var notSent *consumer.NotSentError
	switch {
	case errors.As(err, &denied), errors.As(err, &notSent):
		log.Info().Err(err).Msg("call not made")
		return "error: " + err.Error(), nil
	case errors.As(err, &te):
		log.Info().Err(te.Err).Msg("tool failed")
		return "error: " + te.Err.Error(), nil
	case errors.Is(err, consumer.ErrUnknownTool):
		return "", fmt.Errorf("tool %q is offered to the model but the turn runner does not have it: give the worker the registry's Tools(): %w", c.Name, err)
	case err != nil:
		return "", err
	}
	log.Debug().Msg("tool completed")
	return out, nil
}

// stepResult is one model response.
type stepResult struct {
	content string
	calls   []toolCall
	finish  string
}

// step calls the model once, retrying inside the attempt what may pass
// soon: a 5xx or a lost connection with backoff, a rate limit whose
// Retry-After is at most MaxInlineRetryAfter, and one malformed answer.
// A longer wait ends the attempt with a *RateLimitError at once, so the
// turn runner schedules the next attempt instead of holding the lease.
func (t *turnLoop) step(ctx context.Context, params openai.ChatCompletionNewParams) (stepResult, error) {
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
		t.live.retry()
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

func (t *turnLoop) rateLimited(f *failure, n int) *RateLimitError {
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

func (t *turnLoop) unavailable(f *failure, n int) *ModelError {
	return &ModelError{
		Kind: ErrModelUnavailable, StatusCode: f.status, User: userUnavailable, Cause: f.cause,
		Message: fmt.Sprintf("the model server failed on %s in this attempt (last: %s): check that it is up and not overloaded at BATON_MODEL_BASE_URL (--model-base-url)", calls(n), f.what),
	}
}

func (t *turnLoop) malformed(f *failure, n int) *ModelError {
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
func (t *turnLoop) call(ctx context.Context, params openai.ChatCompletionNewParams) (st stepResult, err error) {
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

func (t *turnLoop) whole(ctx context.Context, params openai.ChatCompletionNewParams, opt option.RequestOption) (stepResult, error) {
	comp, err := t.chat.New(ctx, params, opt)
	if err != nil {
		return stepResult{}, err
	}
	if len(comp.Choices) == 0 {
		return stepResult{}, errNoChoices
	}
	ch := comp.Choices[0]
	st := stepResult{content: ch.Message.Content, finish: ch.FinishReason}
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

func (t *turnLoop) stream(ctx context.Context, params openai.ChatCompletionNewParams, opt option.RequestOption) (stepResult, error) {
	s := t.chat.NewStreaming(ctx, params, opt)
	defer s.Close()
	var st stepResult
	var content strings.Builder
	var calls toolCalls
	for s.Next() {
		for _, ch := range s.Current().Choices {
			if ch.Index != 0 {
				continue
			}
			text := ch.Delta.Content
			if text == "" {
				text = ch.Delta.Refusal
			}
			if text != "" {
				t.live.separate()
				t.live.delta(text)
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
	st.calls = calls.list()
	return st, nil
}

var (
	errNoChoices  = errors.New("the response has no choices")
	errIncomplete = errors.New("the streamed response ended without a finish reason")
)
