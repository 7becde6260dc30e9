package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/telemetry"
)

// External is a consumer.Agent written in any language and served over
// HTTP, speaking AG-UI or the AI SDK's chat route: a step function. Each
// step of a turn is one POST (retried as the same request): the
// conversation, the turn's earlier steps with their tool calls and
// results, and the tools Baton declares go in; text (streamed to the live
// reply), reasoning and tool calls come back. A call of a declared tool
// is returned to the turn runner, which journals and runs it and asks
// for the next step; the agent never runs it. What the agent runs itself
// (its own tools) is outside the journal.
//
// A step's identity is its key (consumer.StepRequest.Key), sent as the
// run id and the Idempotency-Key: the same for every post of the step,
// automatic retries and re-claims included; only a user's explicit retry
// changes it. A stopped turn aborts the open request.
type External struct {
	cfg    ExternalConfig
	codec  codec
	client *http.Client
	// slots holds a token per request in flight (MaxInFlight).
	slots chan struct{}
	log   zerolog.Logger
	// secrets are what is taken out of any text of the agent's that
	// Baton shows or logs: header values and the URL's credentials.
	secrets []string
	// endpoint names the agent, without a secret, to OnOutcome.
	endpoint Endpoint
	metrics  *externalMetrics
}

var _ consumer.Agent = (*External)(nil)

// NewExternal checks the configuration and returns the agent. An A2A
// agent (ProtocolA2A) is built by NewA2A.
func NewExternal(cfg ExternalConfig) (*External, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	x := &External{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight),
		log: cfg.Logger.With().Str("protocol", cfg.Protocol).Logger()}
	x.secrets = secretsOf(cfg)
	x.endpoint = EndpointOf(cfg.Protocol, cfg.URL)
	metrics, err := newExternalMetrics(cfg.Registerer, cfg.Protocol)
	if err != nil {
		return nil, fmt.Errorf("agent: register the metrics of the external agent: %w", err)
	}
	x.metrics = metrics
	switch cfg.Protocol {
	case ProtocolAGUI:
		x.codec = agui{}
	case ProtocolAISDK:
		x.codec = aisdk{}
	default:
		return nil, setting.Errorf("Protocol", fmt.Sprintf("%q", cfg.Protocol), "NewExternal builds %q and %q agents: build an A2A agent with NewA2A", ProtocolAGUI, ProtocolAISDK)
	}
	if x.client, err = httpClientOf(cfg); err != nil {
		return nil, err
	}
	return x, nil
}

// httpClientOf is the client of an external agent's requests: the one
// given, or one of its own that trusts TLSCAFile too and follows no
// redirect.
func httpClientOf(cfg ExternalConfig) (*http.Client, error) {
	if cfg.HTTPClient != nil {
		return cfg.HTTPClient, nil
	}
	transport := &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true, MaxIdleConns: 100,
		IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second, ExpectContinueTimeout: time.Second}
	if d, ok := http.DefaultTransport.(*http.Transport); ok {
		transport = d.Clone()
	}
	transport.MaxIdleConnsPerHost = cfg.MaxInFlight
	if cfg.TLSCAFile != "" {
		pool, err := readCAs(cfg.TLSCAFile)
		if err != nil {
			return nil, err
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{
		Transport: transport,
		// A redirect is answered as what it is: the headers (a key, a
		// token) go to the configured URL alone.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

// Audience is who the agent's tokens are for (ExternalConfig.Audience).
func (x *External) Audience() string { return x.cfg.Audience }

// threadID names the conversation with server key conversation to the
// agent.
func (x *External) threadID(conversation string) string {
	if x.cfg.ThreadID == ThreadIDUUID {
		return uuid.NewSHA1(ThreadNamespace, []byte(conversation)).String()
	}
	return conversation
}

// Step answers one step with one request, retried inside the step for
// what may pass soon (see run).
func (x *External) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	turn := req.Turn
	key := req.Key()
	files, err := fileLinksOf(ctx, turn)
	if err != nil {
		return consumer.Step{}, err
	}
	body, err := json.Marshal(x.codec.body(stepInput{req: req, thread: x.threadID(turn.ConversationID), key: key, files: files}))
	if err != nil {
		return consumer.Step{}, fmt.Errorf("agent: encode the step request: %w", err)
	}
	s := x.newStep(req, key, x.codec.endEvent())
	s.body = body
	var ans *answer
	err = s.run(ctx, func(ctx context.Context) (err error) {
		ans, err = s.post(ctx)
		return err
	})
	out := consumer.Step{Requests: s.requests}
	if err != nil {
		return out, err
	}
	out, err = s.finish(ans, out)
	s.answered(err)
	return out, err
}

// newStep is the state of one step of req, whose key is key; end names
// the event that ends an answer of the protocol.
func (x *External) newStep(req consumer.StepRequest, key, end string) *externalStep {
	turn := req.Turn
	s := &externalStep{External: x, req: req, key: key, live: req.Live, end: end,
		log: x.log.With().Str("conversation_id", turn.ConversationID).Str("run_id", turn.RunID).Str("turn_id", turn.TurnID).
			Int("step", req.Index).Str("step_key", key).Logger()}
	if s.live == nil {
		s.live = noLive{}
	}
	return s
}

// noLive shows nothing, for a step asked for without a live reply.
type noLive struct{}

func (noLive) Text(string)      {}
func (noLive) Reasoning(string) {}
func (noLive) Retry()           {}

// externalStep is the state of one step and its retries.
type externalStep struct {
	*External
	req  consumer.StepRequest
	key  string
	body []byte
	live consumer.StepLive
	log  zerolog.Logger
	// end names the event that ends an answer, for the operator's text
	// about a stream that ended without it.
	end string
	// requests counts the requests made, retries included.
	requests int
	// token is the bearer token of the request in flight, kept to take it
	// out of what the agent's error answers say.
	token string
	// sent is when the last request was sent, zero until it is; status
	// is its answer's HTTP status, 0 until one came.
	sent   time.Time
	status int
}

// finish turns the answer into the step, or the error it calls for.
func (s *externalStep) finish(ans *answer, out consumer.Step) (consumer.Step, error) {
	st := ans.step()
	out.Text, out.Reasoning, out.Calls = st.Text, st.Reasoning, st.Calls
	if len(ans.interrupts) > 0 {
		// Questions for a person: the turn waits for their answers, which
		// go back to the agent with the next step.
		out.Questions = questionsOf(ans.interrupted())
		return out, nil
	}
	nothingYet := out.Text == "" && s.req.ReplySoFar() == ""
	switch {
	case ans.filtered:
		return out, &ModelError{Kind: ErrContentFiltered, User: userFiltered, Message: `the agent's model stopped its answer for its content filter (finish reason "content-filter"); another attempt would be filtered too: if this happens often, check the agent's instructions`}
	case ans.truncated && nothingYet:
		return out, &ModelError{Kind: ErrTruncated, User: userTruncated, Message: `the agent's model reached its output limit (finish reason "length") before it wrote any text: raise the output token limit of the agent's model`}
	case ans.truncated:
		// As for the model: the text so far is the reply, marked cut
		// off, and the calls (perhaps cut in half) do not run.
		out.Truncated = true
	case len(out.Calls) == 0 && nothingYet:
		return out, &ModelError{Kind: ErrEmptyReply, User: userAgentEmpty, Message: fmt.Sprintf(
			"the agent answered the step with no text and no call of a tool Baton declares (%d tool calls in all); another attempt would likely do the same: check the agent's log, and that it answers %s at BATON_AGENT_URL (--agent-url)",
			len(ans.calls), s.cfg.Protocol)}
	}
	return out, nil
}

// run posts the step with post, retrying inside the attempt what may
// pass soon: a 5xx, a 408 or 425, a lost connection, a stream cut short,
// a timeout, a failure the agent reported, and a rate limit whose
// Retry-After is at most MaxInlineRetryAfter, each with the same body,
// run id and Idempotency-Key. A longer wait ends the attempt with a
// *RateLimitError at once, so that the turn runner releases the turn
// instead of holding its lease. post returns a *stepFault for a failure
// that run judges.
func (s *externalStep) run(ctx context.Context, post func(context.Context) error) error {
	failed := 0
	for {
		s.requests++
		err := post(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		var f *stepFault
		if !errors.As(err, &f) {
			return err
		}
		failed++
		retries := max(s.cfg.MaxRetries, 0)
		var wait time.Duration
		var end error
		switch {
		case f.terminal != nil:
			end = f.terminal
		case f.hasRetryAfter && f.retryAfter > s.cfg.MaxInlineRetryAfter,
			f.rateLimit && (!f.hasRetryAfter || failed > retries):
			end = s.rateLimited(f, failed)
		case failed > retries:
			end = s.exhausted(f, failed)
		case f.hasRetryAfter:
			wait = f.retryAfter
		default:
			wait = backoff(failed-1, s.cfg.RetryBaseDelay, s.cfg.MaxRetryDelay)
		}
		if end != nil {
			s.failed(outcomeFailed, f)
			return end
		}
		s.failed(outcomeRetried, f)
		// The live reply drops what the failed request showed.
		s.live.Retry()
		s.log.Warn().Str("failure", f.what).Int("status_code", f.status).Int("retry", failed).Dur("wait", wait).Msg("agent step request failed; retrying")
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return context.Cause(ctx)
		case <-timer.C:
		}
	}
}

// post makes one request and reads its answer, judged by its progress
// (see watch) and capped at Timeout. A failure comes back as a
// *stepFault, or as the step's own context error.
func (s *externalStep) post(ctx context.Context) (ans *answer, err error) {
	err = s.call(ctx, func(callCtx context.Context, cancel context.CancelCauseFunc) error {
		ans, err = s.stream(callCtx, cancel)
		return err
	})
	return ans, err
}

// call runs do as one request of the step (a post, retried by run): it
// waits for a place among MaxInFlight, opens the request's span, and
// gives do a context capped at Timeout, which do's progress watch may
// end sooner with cancel.
func (s *externalStep) call(ctx context.Context, do func(callCtx context.Context, cancel context.CancelCauseFunc) error) (err error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-s.slots }()
	s.sent, s.status = time.Time{}, 0

	// One span per request, retries included; never the content.
	ctx, span := telemetry.Tracer().Start(ctx, "invoke_agent "+s.cfg.Protocol, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "invoke_agent"),
			attribute.String("baton.agent.protocol", s.cfg.Protocol),
			attribute.Int("baton.step", s.req.Index),
			attribute.Int("baton.step_request", s.requests),
			attribute.Int("baton.attempt", max(s.req.Turn.Attempt, 1)),
		))
	defer func() {
		var f *stepFault
		switch {
		case errors.As(err, &f):
			span.SetStatus(codes.Error, f.what)
			if f.status != 0 {
				span.SetAttributes(attribute.Int("http.response.status_code", f.status))
			}
		case err != nil:
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()

	capCtx, stopCap := context.WithTimeoutCause(ctx, s.cfg.Timeout, &timeoutError{what: "cap", after: s.cfg.Timeout})
	defer stopCap()
	callCtx, cancel := context.WithCancelCause(capCtx)
	defer cancel(nil)
	return do(callCtx, cancel)
}

// stream posts the step and reads the events of its answer.
func (s *externalStep) stream(callCtx context.Context, cancel context.CancelCauseFunc) (*answer, error) {
	hreq, err := s.request(callCtx)
	if err != nil {
		return nil, err
	}
	s.log.Debug().Int("request", s.requests).Int("bytes", len(s.body)).Msg("agent step request")
	w := newWatch(s.cfg.FirstByteTimeout, s.cfg.IdleTimeout, true, cancel)
	defer w.stop()
	inFlight := s.metrics.inFlight.WithLabelValues(s.cfg.Protocol)
	inFlight.Inc()
	defer inFlight.Dec()
	s.sent = time.Now()
	w.start()
	res, err := s.client.Do(hreq)
	if err != nil {
		return nil, s.classify(callCtx, &transportError{err: err})
	}
	s.status = res.StatusCode
	body := &watchedBody{rc: res.Body, w: w}
	defer body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(body, maxErrorBody))
		return nil, s.classifyStatus(res.StatusCode, res.Header, b)
	}
	if ct := res.Header.Get("Content-Type"); ct != "" {
		if mt, _, _ := mime.ParseMediaType(ct); mt != "text/event-stream" {
			return nil, s.malformed(malformedf("it answered with %q instead of server-sent events", truncate(ct, 80)))
		}
	}
	ans := newAnswer(s.live, s.req.Tools, s.cfg.MaxToolCalls, &s.log)
	dec := s.codec.decoder(ans)
	events := newSSEReader(&capReader{r: body, max: s.cfg.MaxStepBytes})
	for {
		data, err := events.next()
		if errors.Is(err, io.EOF) {
			err = errStreamEnded
		}
		if err == nil {
			var end bool
			if end, err = dec.event(data); err == nil && end {
				return ans, nil
			}
		}
		if err != nil {
			return nil, s.classify(callCtx, err)
		}
	}
}

// errStreamEnded is a stream that ended before the step did: a dropped
// connection, or an agent that gave up without saying so.
var errStreamEnded = errors.New("the stream ended before the step did")

// request is the HTTP request of one post of the step.
func (s *externalStep) request(ctx context.Context) (*http.Request, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(s.body))
	if err != nil {
		// The error quotes the URL, which may hold credentials.
		return nil, errors.New("agent: the agent URL cannot make a request: check BATON_AGENT_URL (--agent-url)")
	}
	for name, value := range s.cfg.Headers {
		hreq.Header.Set(name, value)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	hreq.Header.Set("Idempotency-Key", s.key)
	token, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if token != "" {
		hreq.Header.Set("Authorization", "Bearer "+token)
	}
	return hreq, nil
}

// authorize returns the bearer token of a request of the step from the
// Authorizer, "" without one, and keeps it to take it out of what the
// agent's error answers say.
func (s *externalStep) authorize(ctx context.Context) (string, error) {
	s.token = ""
	if s.cfg.Authorizer == nil {
		return "", nil
	}
	// The token ends no later than the request may, nor than the turn's
	// lease: past it another worker may own the turn.
	deadline := time.Now().Add(s.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if d, ok := consumer.LeaseDeadline(ctx); ok && d.Before(deadline) {
		deadline = d
	}
	token, err := s.cfg.Authorizer.Authorize(ctx, s.req, deadline)
	if err != nil {
		return "", fmt.Errorf("agent: make the token of the step request: %w", err)
	}
	s.token = token
	return token, nil
}

// secretsOf lists what an agent may echo of what it was sent that must
// not be shown: the header values (whole, and their words, as in "Bearer
// <token>"), and the URL's user information and query values.
func secretsOf(cfg ExternalConfig) []string {
	var out []string
	for _, v := range cfg.Headers {
		out = append(out, v)
		out = append(out, strings.Fields(v)...)
	}
	if u, err := url.Parse(cfg.URL); err == nil {
		if u.User != nil {
			p, _ := u.User.Password()
			out = append(out, u.User.Username(), p)
		}
		if u.RawQuery != "" {
			out = append(out, u.RawQuery)
			for _, vs := range u.Query() {
				out = append(out, vs...)
			}
		}
	}
	// Longer first, so that a secret inside another goes with it.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redact takes the secrets and the token out of a text of the agent's,
// which may echo what it was sent. Strings shorter than six bytes are
// left: taking them out would mangle the text and hide nothing.
func (s *externalStep) redact(text string) string {
	for _, v := range append([]string{s.token}, s.secrets...) {
		if len(v) >= 6 {
			text = strings.ReplaceAll(text, v, "[redacted]")
		}
	}
	return detail(text, "")
}

// Endpoint names the agent without a secret, as `baton status` shows it.
func (x *External) Endpoint() Endpoint { return x.endpoint }
