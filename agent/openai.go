package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer"
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
	// itself, so that a retry is counted in the turn's budget, waits
	// Retry-After under MaxRetryDelay, and resets the live reply.
	chat := openai.NewChatCompletionService(
		option.WithBaseURL(cfg.BaseURL),
		option.WithAPIKey(cfg.APIKey),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(0),
	)
	return &OpenAI{cfg: cfg, chat: chat, log: cfg.Logger.With().Str("component", "agent").Str("model", cfg.Model).Logger()}, nil
}

// Run answers one turn. The reply is the text of every model step, one
// paragraph each; it is also what the live events of the run add up to.
func (a *OpenAI) Run(ctx context.Context, turn consumer.Turn, tools consumer.ToolExecutor) (consumer.Reply, error) {
	log := a.log.With().Str("conversation_id", turn.ConversationID).Str("run_id", turn.RunID).Str("turn_id", turn.TurnID).Logger()
	lv := newLive(a.cfg.Live, turn.ConversationID, turn.RunID, log)
	if turn.Attempt > 1 {
		// Subscribers of the conversation drop what an earlier attempt
		// showed.
		lv.publish(batonnats.DeltaReset, "")
	}
	t := &turnLoop{OpenAI: a, log: log, live: lv, tools: tools, ids: map[string]bool{}}
	reply, err := t.run(ctx, messages(a.cfg.SystemPrompt, turn))
	if err != nil {
		lv.failed()
		return consumer.Reply{}, err
	}
	lv.done()
	return consumer.Reply{Content: reply}, nil
}

// turnLoop is the state of one turn.
type turnLoop struct {
	*OpenAI
	log   zerolog.Logger
	live  *live
	tools consumer.ToolExecutor
	// calls counts model calls, retries included.
	calls int
	// ids are the tool call IDs given to the journal in this run.
	ids map[string]bool
}

func (t *turnLoop) run(ctx context.Context, msgs []openai.ChatCompletionMessageParamUnion) (string, error) {
	toolParams := t.cfg.Tools.params()
	for round := 0; ; round++ {
		params := openai.ChatCompletionNewParams{Model: t.cfg.Model, Messages: msgs, Tools: toolParams}
		st, err := t.step(ctx, params)
		if err != nil {
			return "", err
		}
		t.live.commit(st.content)
		if len(st.calls) == 0 {
			if t.live.text() == "" {
				return "", &ModelError{Kind: ErrMalformedResponse, Message: fmt.Sprintf("the model returned an empty reply (finish reason %q)", st.finish)}
			}
			return t.live.text(), nil
		}
		if round >= t.cfg.MaxToolIterations {
			return "", &ModelError{Kind: ErrBudgetExceeded, Message: fmt.Sprintf("the model was still calling tools after %d rounds, the most a turn may use: raise --max-tool-iterations, or rephrase the request", t.cfg.MaxToolIterations)}
		}
		calls := t.identify(round, st.calls)
		msgs = append(msgs, assistantMessage(st.content, calls))
		for _, c := range calls {
			result, err := t.callTool(ctx, c)
			if err != nil {
				return "", err
			}
			msgs = append(msgs, openai.ToolMessage(result, c.ID))
		}
	}
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
	tool, ok := t.cfg.Tools.lookup(c.Name)
	if !ok {
		log.Info().Msg("model called an unknown tool")
		return fmt.Sprintf("error: there is no tool %q; the tools are: %s", c.Name, strings.Join(t.cfg.Tools.Names(), ", ")), nil
	}
	args := strings.TrimSpace(c.Arguments)
	if args == "" {
		args = "{}"
	}
	if err := tool.validate(json.RawMessage(args)); err != nil {
		log.Info().Err(err).Msg("model called a tool with invalid arguments")
		return "error: " + err.Error(), nil
	}
	out, err := t.tools.Call(ctx, consumer.ToolCall{ID: c.ID, Tool: c.Name, Arguments: json.RawMessage(args)})
	var te *ToolError
	switch {
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

// step calls the model once, retrying 429, 5xx and lost connections with
// backoff inside the attempt.
func (t *turnLoop) step(ctx context.Context, params openai.ChatCompletionNewParams) (stepResult, error) {
	for retry := 0; ; retry++ {
		if t.calls >= t.cfg.MaxModelCalls {
			return stepResult{}, &ModelError{Kind: ErrBudgetExceeded, Message: fmt.Sprintf("the turn used all %d model calls it may make: raise --max-model-calls, or rephrase the request", t.cfg.MaxModelCalls)}
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
		if !f.retryable || retry >= max(t.cfg.MaxRetries, 0) {
			return stepResult{}, f.err
		}
		wait := backoff(retry, t.cfg.RetryBaseDelay, t.cfg.MaxRetryDelay)
		if f.hasRetryAfter {
			if f.retryAfter > t.cfg.MaxRetryDelay {
				f.err.Message += fmt.Sprintf("; it asked to wait %s, longer than the %s an attempt waits", f.retryAfter, t.cfg.MaxRetryDelay)
				return stepResult{}, f.err
			}
			wait = f.retryAfter
		}
		t.live.retry()
		t.log.Warn().Err(f.err.Cause).Int("status_code", f.err.StatusCode).Int("retry", retry+1).Dur("wait", wait).Msg("model call failed; retrying")
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return stepResult{}, context.Cause(ctx)
		case <-timer.C:
		}
	}
}

// failure is a failed model call, classified.
type failure struct {
	err           *ModelError
	retryable     bool
	retryAfter    time.Duration
	hasRetryAfter bool
}

func (f *failure) Error() string { return f.err.Error() }

// call makes one request, streamed unless DisableStreaming.
func (t *turnLoop) call(ctx context.Context, params openai.ChatCompletionNewParams) (st stepResult, err error) {
	reqCtx, cancel := context.WithTimeout(ctx, t.cfg.RequestTimeout)
	defer cancel()
	if t.cfg.DisableStreaming {
		st, err = t.whole(reqCtx, params)
	} else {
		st, err = t.stream(reqCtx, params)
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			return st, &failure{err: &ModelError{Kind: ErrModelTimeout, Message: fmt.Sprintf("the model did not answer within %s: raise --model-timeout, or check the model server at BATON_MODEL_BASE_URL", t.cfg.RequestTimeout), Cause: err}}
		}
		return st, t.classify(err)
	}
	return st, nil
}

func (t *turnLoop) whole(ctx context.Context, params openai.ChatCompletionNewParams) (stepResult, error) {
	comp, err := t.chat.New(ctx, params)
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

func (t *turnLoop) stream(ctx context.Context, params openai.ChatCompletionNewParams) (stepResult, error) {
	s := t.chat.NewStreaming(ctx, params)
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

// classify turns a failed call into what the turn does about it.
func (t *turnLoop) classify(err error) *failure {
	var apiErr *openai.Error
	var streamErr *ssestream.StreamError
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &apiErr):
		status := apiErr.StatusCode
		if status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500 {
			f := &failure{retryable: true, err: &ModelError{
				Kind: ErrModelUnavailable, StatusCode: status, Cause: err,
				Message: fmt.Sprintf("the model server is unavailable (%d %s) after %d retries: check its load and limits at BATON_MODEL_BASE_URL", status, http.StatusText(status), max(t.cfg.MaxRetries, 0)),
			}}
			if apiErr.Response != nil {
				f.retryAfter, f.hasRetryAfter = retryAfter(apiErr.Response.Header, time.Now())
			}
			return f
		}
		detail := apiErr.Message
		if detail == "" && apiErr.JSON.Message.Valid() {
			detail = apiErr.JSON.Message.Raw()
		}
		return &failure{err: refusal(status, t.cfg.Model, detail, err)}
	case errors.As(err, &streamErr):
		return &failure{retryable: true, err: &ModelError{Kind: ErrModelUnavailable, Cause: err,
			Message: fmt.Sprintf("the model server reported an error while streaming (%s)", truncate(streamErr.Message, 300))}}
	case errors.As(err, &syntaxErr), errors.As(err, &typeErr), errors.Is(err, errNoChoices):
		return &failure{err: &ModelError{Kind: ErrMalformedResponse, Cause: err,
			Message: fmt.Sprintf("the model server's answer is not a chat completion (%v): check that BATON_MODEL_BASE_URL points at an OpenAI-compatible API", err)}}
	default:
		// A lost connection, a refused dial, a stream cut short.
		return &failure{retryable: true, err: &ModelError{Kind: ErrModelUnavailable, Cause: err,
			Message: fmt.Sprintf("the model server could not be reached or stopped answering (%v): check BATON_MODEL_BASE_URL (--model-base-url)", err)}}
	}
}
