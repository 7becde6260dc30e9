package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/google/uuid"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/schema"
)

// A2AVersion is the version of A2A that Baton speaks, sent as the header
// A2A-Version with every request.
const A2AVersion = "1.0"

// A2AMessageNamespace is the namespace of the messageIds Baton sends to an
// A2A agent: the message of the step with key k is
// UUIDv5(A2AMessageNamespace, k), which any language can compute again.
// It never changes.
var A2AMessageNamespace = uuid.MustParse("c1a0c6d3-11ca-407d-8730-79039d13a2fc")

// A2AMessageID is the messageId of the step whose key is stepKey
// (consumer.StepRequest.Key).
func A2AMessageID(stepKey string) string {
	return uuid.NewSHA1(A2AMessageNamespace, []byte(stepKey)).String()
}

// Waits of an A2A step.
const (
	// a2aPollInterval is the wait between two GetTask of a task that
	// cannot be subscribed to.
	a2aPollInterval = 500 * time.Millisecond
	// a2aCancelTimeout bounds the CancelTask of an abandoned step, whose
	// own context is done.
	a2aCancelTimeout = 5 * time.Second
	// a2aMaxTaskPages bounds the pages of ListTasks read to find an
	// earlier task of a step's message (100 tasks a page).
	a2aMaxTaskPages = 20
)

// A2A is a consumer.Agent served over A2A 1.0 (JSON-RPC): an opaque agent
// that runs its own tools. Baton declares it no tool, and each step is
// one A2A message whose task answers it: the turn's user messages go in
// as text parts; the text of the task's artifacts comes back, streamed to
// the live reply, and is the step's text. The step asks for no tool, so
// a turn is one step. The agent keeps the conversation itself, by its
// contextId (the conversation, named as ExternalConfig.ThreadID says):
// Baton sends it no history. What the agent runs is outside Baton's
// journal.
//
// A2A has no idempotency: the same messageId sent twice makes two tasks.
// A step's messageId is A2AMessageID of its key, the same for every post
// of the step; before it sends the message, a step looks for a task of
// the context that holds it (ListTasks), left by an earlier post whose
// answer was lost (a dropped stream, a worker that died), and follows
// that task to its end instead of sending the message again.
//
// A step that is never posted again (consumer.StepAbandoned: the turn was
// stopped or superseded) cancels its task (CancelTask). A task that needs
// a person's input (INPUT_REQUIRED) ends the step with a
// question for a person; one that failed or was rejected fails the turn.
// Requests are retried, limited and authorized as for the other external
// agents (ExternalConfig).
type A2A struct {
	x      *External
	client *a2aclient.Client
}

var _ consumer.Agent = (*A2A)(nil)

// NewA2A checks the configuration, whose Protocol is ProtocolA2A (or
// empty), and returns the agent.
func NewA2A(cfg ExternalConfig) (*A2A, error) {
	if cfg.Protocol == "" {
		cfg.Protocol = ProtocolA2A
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Protocol != ProtocolA2A {
		return nil, setting.Errorf("Protocol", fmt.Sprintf("%q", cfg.Protocol), "NewA2A builds A2A agents (%q): build an agent of another protocol with NewExternal", ProtocolA2A)
	}
	hc, err := httpClientOf(cfg)
	if err != nil {
		return nil, err
	}
	watched := *hc
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	watched.Transport = &a2aTransport{next: next}
	x := &External{cfg: cfg, client: &watched, slots: make(chan struct{}, cfg.MaxInFlight),
		log: cfg.Logger.With().Str("protocol", cfg.Protocol).Logger(), secrets: secretsOf(cfg),
		endpoint: EndpointOf(cfg.Protocol, cfg.URL)}
	if x.metrics, err = newExternalMetrics(cfg.Registerer, cfg.Protocol); err != nil {
		return nil, fmt.Errorf("agent: register the metrics of the A2A agent: %w", err)
	}
	client, err := a2aclient.NewFromEndpoints(context.Background(),
		[]*a2a.AgentInterface{{URL: cfg.URL, ProtocolBinding: a2a.TransportProtocolJSONRPC, ProtocolVersion: A2AVersion}},
		a2aclient.WithDefaultsDisabled(), a2aclient.WithJSONRPCTransport(&watched))
	if err != nil {
		// The error quotes the URL, which may hold credentials.
		return nil, errors.New("agent: no A2A client for the agent URL: check BATON_AGENT_URL (--agent-url)")
	}
	return &A2A{x: x, client: client}, nil
}

// Audience is who the agent's tokens are for (ExternalConfig.Audience).
func (a *A2A) Audience() string { return a.x.cfg.Audience }

// Step answers one step with one task of the agent, retried inside the
// step for what may pass soon (see externalStep.run).
func (a *A2A) Step(ctx context.Context, req consumer.StepRequest) (consumer.Step, error) {
	key := req.Key()
	s := &a2aStep{externalStep: a.x.newStep(req, key, "task state that ends the step: completed, failed, canceled, rejected, input or auth required"), client: a.client,
		contextID: a.x.threadID(req.Turn.ConversationID), messageID: A2AMessageID(key)}
	s.log = s.log.With().Str("message_id", s.messageID).Logger()
	err := s.run(ctx, s.post)
	out := consumer.Step{Requests: s.requests}
	if err != nil {
		if consumer.StepAbandoned(ctx) {
			s.cancelTask(ctx)
		}
		return out, err
	}
	return s.finish(out)
}

// a2aStep is the state of one step of an A2A agent and its retries.
type a2aStep struct {
	*externalStep
	client               *a2aclient.Client
	contextID, messageID string
	// sent is set once the message may have reached the agent.
	sent bool
	// answering is set when the message answers the question of the
	// step before, on the task that asked it.
	answering bool
	// taskID is the agent's task of the message, once known.
	taskID a2a.TaskID
	// reply is what the post in flight, or the last one, read.
	reply *a2aReply
}

// post is one try of the step: it follows the task an earlier post made,
// or sends the message, and reads the task's events until its state ends
// the step.
func (s *a2aStep) post(ctx context.Context) error {
	s.reply = newA2AReply(s.live)
	return s.call(ctx, func(callCtx context.Context, cancel context.CancelCauseFunc) error {
		callCtx = withA2ACall(callCtx, &a2aCall{firstByte: s.cfg.FirstByteTimeout, idle: s.cfg.IdleTimeout, maxBytes: s.cfg.MaxStepBytes, cancel: cancel})
		callCtx, err := s.params(callCtx)
		if err != nil {
			return err
		}
		if err := s.exchange(callCtx); err != nil {
			return s.classifyA2A(callCtx, err)
		}
		return nil
	})
}

// params gives the requests made with ctx their headers: the configured
// ones and the bearer token. (The client sets A2A-Version itself.)
func (s *a2aStep) params(ctx context.Context) (context.Context, error) {
	p := a2aclient.ServiceParams{}
	for name, value := range s.cfg.Headers {
		p.Append(name, value)
	}
	token, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if token != "" {
		p.Append("Authorization", "Bearer "+token)
	}
	return a2aclient.AttachServiceParams(ctx, p), nil
}

func (s *a2aStep) exchange(ctx context.Context) error {
	task, err := s.earlier(ctx)
	if err != nil {
		return err
	}
	if task != nil {
		s.log.Info().Str("task_id", string(task.ID)).Str("state", task.Status.State.String()).
			Msg("an earlier post of the step made a task of its message: following it instead of sending the message again")
		return s.follow(ctx, task)
	}
	s.sent = true
	msg := &a2a.Message{ID: s.messageID, ContextID: s.contextID, Role: a2a.MessageRoleUser,
		Metadata: map[string]any{"baton": s.props()}}
	if task, text, ok := s.answer(); ok {
		// The answer to the question the task asked goes to that task.
		s.answering = true
		msg.TaskID, msg.Parts = a2a.TaskID(task), []*a2a.Part{a2a.NewTextPart(text)}
	} else {
		files, err := fileLinksOf(ctx, s.req.Turn)
		if err != nil {
			return err
		}
		for _, m := range s.req.Turn.Messages {
			text := m.Content
			for _, f := range files[m.Key] {
				if f.url == "" {
					text += "\n\n" + leftOutNote(f.file)
					continue
				}
				p := a2a.NewFileURLPart(a2a.URL(f.url), f.file.MediaType)
				p.Filename = f.file.Filename
				msg.Parts = append(msg.Parts, p)
			}
			if text != "" {
				msg.Parts = append(msg.Parts, a2a.NewTextPart(text))
			}
		}
	}
	s.log.Debug().Int("request", s.requests).Int("parts", len(msg.Parts)).Msg("agent step message")
	return s.read(s.client.SendStreamingMessage(ctx, &a2a.SendMessageRequest{Message: msg}), "SendStreamingMessage")
}

// props tell the agent which step of which turn the message is.
func (s *a2aStep) props() batonProps {
	p := propsOf(stepInput{req: s.req})
	p.RunID = s.key
	return p
}

// earlier returns the task an earlier post of the step made: a task of
// the context whose history holds the step's message. An agent that
// cannot list tasks gets the message again (a warning says so).
func (s *a2aStep) earlier(ctx context.Context) (*a2a.Task, error) {
	req := &a2a.ListTasksRequest{ContextID: s.contextID, PageSize: 100}
	for range a2aMaxTaskPages {
		res, err := s.client.ListTasks(ctx, req)
		if errors.Is(err, a2a.ErrMethodNotFound) || errors.Is(err, a2a.ErrUnsupportedOperation) {
			s.log.Warn().Msg("the agent does not list tasks (ListTasks): the step's message is sent without looking for a task an earlier post made, which may make a second task")
			return nil, nil
		}
		if err != nil {
			return nil, &methodError{method: "ListTasks", err: err}
		}
		for _, t := range res.Tasks {
			for _, m := range t.History {
				if m != nil && m.ID == s.messageID {
					return t, nil
				}
			}
		}
		if res.NextPageToken == "" {
			return nil, nil
		}
		req.PageToken = res.NextPageToken
	}
	s.log.Warn().Int("tasks", a2aMaxTaskPages*100).Msg("the step's message is not among the newest tasks of the context: it is sent again")
	return nil, nil
}

// follow reads the task an earlier post made to the end of the step: its
// events from now on (SubscribeToTask), or its state, polled (GetTask)
// when it ended already or cannot be subscribed to.
func (s *a2aStep) follow(ctx context.Context, task *a2a.Task) error {
	s.sent, s.taskID = true, task.ID
	if !settled(task.Status.State) {
		err := s.read(s.client.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: task.ID}), "SubscribeToTask")
		if err == nil || !errors.Is(err, a2a.ErrUnsupportedOperation) && !errors.Is(err, a2a.ErrMethodNotFound) {
			return err
		}
	}
	// ListTasks leaves the artifacts out: GetTask has them.
	for {
		t, err := s.client.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
		if err != nil {
			return &methodError{method: "GetTask", err: err}
		}
		if s.event(t) {
			return nil
		}
		timer := time.NewTimer(a2aPollInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return context.Cause(ctx)
		case <-timer.C:
		}
	}
}

// read reads the events of a stream until one ends the step.
func (s *a2aStep) read(events iter.Seq2[a2a.Event, error], method string) error {
	for ev, err := range events {
		if err != nil {
			return &methodError{method: method, err: err}
		}
		if s.event(ev) {
			return nil
		}
	}
	return errStreamEnded
}

// event reads one event of the task, shows the reply so far, and reports
// whether it ends the step.
func (s *a2aStep) event(ev a2a.Event) (end bool) {
	r := s.reply
	switch e := ev.(type) {
	case *a2a.Message:
		// An agent that answers with a message and makes no task.
		r.answered(e)
		end = true
	case *a2a.Task:
		s.taskID = e.ID
		if s.answering {
			// The task as it stood when it asked: its state and what it
			// said then are the step before's. The updates that follow
			// answer.
			break
		}
		r.snapshot(e)
		end = settled(e.Status.State)
	case *a2a.TaskStatusUpdateEvent:
		if e.TaskID != "" {
			s.taskID = e.TaskID
		}
		r.setStatus(e.Status)
		if e.Status.State == a2a.TaskStateWorking && r.status != "" {
			s.log.Debug().Int("bytes", len(r.status)).Msg("the agent's task is working (its status message is not the reply)")
		}
		end = settled(e.Status.State)
	case *a2a.TaskArtifactUpdateEvent:
		if e.TaskID != "" {
			s.taskID = e.TaskID
		}
		if e.Artifact != nil {
			r.artifact(e.Artifact, e.Append)
		}
	}
	r.show()
	return end
}

// settled reports whether a task in state ends the step: it ended, or it
// waits for a person.
func settled(state a2a.TaskState) bool {
	return state.Terminal() || state == a2a.TaskStateInputRequired || state == a2a.TaskStateAuthRequired
}

// finish turns the task's end into the step, or the error it calls for.
func (s *a2aStep) finish(out consumer.Step) (consumer.Step, error) {
	r := s.reply
	out.Text = r.text()
	s.log.Debug().Str("task_id", string(s.taskID)).Str("state", r.state.String()).Int("text_bytes", len(out.Text)).
		Bool("message", r.message).Int("skipped_parts", r.skipped).Msg("agent step answered")
	task := string(s.taskID)
	said := ""
	if r.status != "" {
		said = fmt.Sprintf(", saying %q", truncate(s.redact(r.status), 200))
	}
	switch r.state {
	case a2a.TaskStateInputRequired:
		// A question for a person: the turn waits for the answer, which
		// the next step sends to the same task.
		data, _ := json.Marshal(a2aQuestion{TaskID: task, ContextID: s.contextID})
		out.Questions = []consumer.Question{{ID: task, Reason: "input_required", Message: truncate(r.status, 2000), Data: data}}
		return out, nil
	case a2a.TaskStateAuthRequired:
		msg := fmt.Sprintf("the agent's task %s asks for authentication of its own (TASK_STATE_AUTH_REQUIRED%s), which Baton cannot give: give the agent the credentials its own tools need", task, said)
		return out, &ModelError{Kind: ErrAgentAuth, Message: msg, User: userAgentAuth}
	case a2a.TaskStateRejected:
		msg := fmt.Sprintf("the agent rejected the step's task %s (TASK_STATE_REJECTED%s): it will not answer this message; check the agent's log", task, said)
		return out, &ModelError{Kind: ErrAgentRefused, Message: msg, User: userAgentRejected}
	case a2a.TaskStateFailed, a2a.TaskStateCanceled:
		msg := fmt.Sprintf("the agent's task %s of the step ended %s%s: check the agent's log; another attempt would find the same task, so the turn fails now (a user's retry sends a new message)", task, r.state, said)
		return out, &ModelError{Kind: ErrAgentTaskFailed, Message: msg, User: userAgentFailed}
	}
	if out.Text == "" && s.req.ReplySoFar() == "" {
		return out, &ModelError{Kind: ErrEmptyReply, User: userAgentEmpty, Message: fmt.Sprintf(
			"the agent's task %s completed with no text (no text part in its artifacts, nor in its last status message; %d parts of other kinds): check the agent's log, and that it answers A2A %s at BATON_AGENT_URL (--agent-url)",
			task, r.skipped, A2AVersion)}
	}
	return out, nil
}

// cancelTask cancels the step's task, for a step that is never posted
// again. The step's context is done: the request has a timeout of its
// own. A message whose task no event named yet is looked for first.
func (s *a2aStep) cancelTask(ctx context.Context) {
	if !s.sent {
		return
	}
	cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), a2aCancelTimeout)
	defer stop()
	callCtx, cancel := context.WithCancelCause(cctx)
	defer cancel(nil)
	callCtx = withA2ACall(callCtx, &a2aCall{firstByte: a2aCancelTimeout, idle: a2aCancelTimeout, maxBytes: s.cfg.MaxStepBytes, cancel: cancel})
	callCtx, err := s.params(callCtx)
	if err == nil && s.taskID == "" {
		var task *a2a.Task
		if task, err = s.earlier(callCtx); task != nil {
			s.taskID = task.ID
		}
	}
	if err == nil && s.taskID == "" {
		s.log.Warn().Msg("the step was abandoned after its message was sent, and the agent lists no task of it: nothing to cancel")
		return
	}
	if err == nil {
		_, err = s.client.CancelTask(callCtx, &a2a.CancelTaskRequest{ID: s.taskID})
		if err != nil {
			err = &methodError{method: "CancelTask", err: err}
		}
	}
	log := s.log.With().Str("task_id", string(s.taskID)).Logger()
	switch {
	case err == nil:
		log.Info().Msg("the step was abandoned (the turn was stopped or superseded): its task is canceled")
	case errors.Is(err, a2a.ErrTaskNotCancelable):
		log.Info().Msg("the step was abandoned after its task ended: nothing to cancel")
	default:
		var f *stepFault
		what := s.redact(err.Error())
		if errors.As(s.classifyA2A(callCtx, err), &f) {
			what = f.what
		}
		log.Warn().Str("failure", what).Msg("the step was abandoned, and its task could not be canceled: the agent may go on with it")
	}
}

// methodError is a failed call of an A2A method.
type methodError struct {
	method string
	err    error
}

func (e *methodError) Error() string { return e.method + ": " + e.err.Error() }
func (e *methodError) Unwrap() error { return e.err }

// classifyA2A classifies a failed post: a JSON-RPC error by its code, the
// rest as for the other external agents.
func (s *a2aStep) classifyA2A(callCtx context.Context, err error) error {
	var te *timeoutError
	var se *statusError
	var ae *a2a.Error
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(context.Cause(callCtx), &te):
		return s.classify(callCtx, err)
	case errors.As(err, &se):
		return s.classifyStatus(se.status, se.header, se.body)
	case errors.As(err, &ae):
		return s.rpcFault(err, ae)
	case errors.As(err, &syntax):
		return s.malformed(malformedf("an answer is not JSON (%s)", syntax))
	case errors.As(err, &typ):
		return s.malformed(malformedf("an answer does not have the fields of A2A %s (%s)", A2AVersion, typ))
	}
	return s.classify(callCtx, err)
}

// rpcFault classifies a JSON-RPC error: a refusal that another request
// would meet again is terminal; an internal error of the agent is
// retried, as a failed run.
func (s *a2aStep) rpcFault(err error, ae *a2a.Error) *stepFault {
	method := "a request"
	var me *methodError
	if errors.As(err, &me) {
		method = me.method
	}
	what := fmt.Sprintf("%s answered JSON-RPC error %d: %s", method, rpcCode(ae), s.redact(ae.Error()))
	switch {
	case errors.Is(ae, a2a.ErrVersionNotSupported):
		return s.terminal(ErrAgentRefused, 0, userAgentSetup, ae,
			"the agent does not take A2A %s (%s): Baton speaks A2A %s over JSON-RPC (--agent a2a) and sends the header A2A-Version: %s with every request; check that the agent at BATON_AGENT_URL (--agent-url) serves A2A %s, and that no proxy between them drops the A2A-Version header",
			A2AVersion, what, A2AVersion, A2AVersion, A2AVersion)
	case errors.Is(ae, a2a.ErrUnauthenticated), errors.Is(ae, a2a.ErrUnauthorized):
		return s.terminal(ErrAgentAuth, 0, userAgentAuth, ae,
			"the agent refused Baton's credentials (%s): check the token it expects: the headers Baton sends it (--agent-header), or the signing key and the audience (%q) of the tokens Baton signs for it", what, s.cfg.Audience)
	case errors.Is(ae, a2a.ErrInternalError), errors.Is(ae, a2a.ErrServerError),
		errors.Is(ae, a2a.ErrInvalidAgentResponse), errors.Is(ae, a2a.ErrTaskNotFound):
		return &stepFault{kind: ErrAgentFailed, what: what, cause: ae}
	default:
		return s.terminal(ErrAgentRefused, 0, userAgentSetup, ae,
			"the agent rejected the step (%s): check that it serves A2A %s over JSON-RPC (--agent a2a) at BATON_AGENT_URL (--agent-url), and its log for why", what, A2AVersion)
	}
}

// rpcCodes are the JSON-RPC codes of A2A's errors, for the operator's
// text (the client keeps the error, not its code).
var rpcCodes = []struct {
	err  error
	code int
}{
	{a2a.ErrParseError, -32700}, {a2a.ErrInvalidRequest, -32600}, {a2a.ErrMethodNotFound, -32601},
	{a2a.ErrInvalidParams, -32602}, {a2a.ErrInternalError, -32603}, {a2a.ErrServerError, -32000},
	{a2a.ErrTaskNotFound, -32001}, {a2a.ErrTaskNotCancelable, -32002}, {a2a.ErrPushNotificationNotSupported, -32003},
	{a2a.ErrUnsupportedOperation, -32004}, {a2a.ErrUnsupportedContentType, -32005}, {a2a.ErrInvalidAgentResponse, -32006},
	{a2a.ErrExtendedCardNotConfigured, -32007}, {a2a.ErrExtensionSupportRequired, -32008}, {a2a.ErrVersionNotSupported, -32009},
	{a2a.ErrUnauthenticated, -31401}, {a2a.ErrUnauthorized, -31403},
}

func rpcCode(ae *a2a.Error) int {
	for _, c := range rpcCodes {
		if errors.Is(ae.Err, c.err) {
			return c.code
		}
	}
	return -32603
}

// a2aReply is what the events of a task said so far: the text of its
// artifacts, shown live as it grows, and its state and status message.
type a2aReply struct {
	live consumer.StepLive
	// shown is what the live reply shows.
	shown     string
	artifacts []*a2aArtifact
	byID      map[a2a.ArtifactID]*a2aArtifact
	state     a2a.TaskState
	// status is the text of the latest status message: the answer of an
	// agent that answers in it, the question of one that asks.
	status string
	// message is set for an agent that answered with a message and made
	// no task.
	message bool
	// skipped counts the parts that are not text.
	skipped int
}

// a2aArtifact is the text of one artifact.
type a2aArtifact struct {
	id   a2a.ArtifactID
	text string
}

func newA2AReply(live consumer.StepLive) *a2aReply {
	return &a2aReply{live: live, byID: map[a2a.ArtifactID]*a2aArtifact{}}
}

// partsText is the text parts joined by sep; the others are counted.
func (r *a2aReply) partsText(parts a2a.ContentParts, sep string) string {
	var texts []string
	for _, p := range parts {
		if p == nil {
			continue
		}
		if _, ok := p.Content.(a2a.Text); !ok {
			r.skipped++
			continue
		}
		texts = append(texts, p.Text())
	}
	return strings.Join(texts, sep)
}

// artifact reads an artifact update: its parts are added to the
// artifact's (append) or replace them. The parts of one artifact are
// joined as they are: a streamed artifact comes in pieces.
func (r *a2aReply) artifact(a *a2a.Artifact, add bool) {
	text := r.partsText(a.Parts, "")
	x, ok := r.byID[a.ID]
	switch {
	case !ok:
		x = &a2aArtifact{id: a.ID, text: text}
		r.artifacts = append(r.artifacts, x)
		r.byID[a.ID] = x
	case add:
		x.text += text
	default:
		x.text = text
	}
}

// snapshot reads a whole task, which replaces what was read of it.
func (r *a2aReply) snapshot(t *a2a.Task) {
	r.artifacts, r.byID = nil, map[a2a.ArtifactID]*a2aArtifact{}
	for _, a := range t.Artifacts {
		if a != nil {
			r.artifact(a, false)
		}
	}
	r.setStatus(t.Status)
}

func (r *a2aReply) setStatus(st a2a.TaskStatus) {
	r.state, r.status = st.State, ""
	if st.Message != nil {
		r.status = r.partsText(st.Message.Parts, paragraph)
	}
}

func (r *a2aReply) answered(m *a2a.Message) {
	r.message, r.state = true, a2a.TaskStateCompleted
	r.status = r.partsText(m.Parts, paragraph)
}

// text is the reply: the artifacts' texts, a paragraph each; or, for a
// task that completed without one (or a message), the text of its last
// status message. A working task's status messages are notes on its
// progress, not the reply.
func (r *a2aReply) text() string {
	var texts []string
	for _, a := range r.artifacts {
		if a.text != "" {
			texts = append(texts, a.text)
		}
	}
	if len(texts) == 0 && r.state == a2a.TaskStateCompleted {
		return r.status
	}
	return strings.Join(texts, paragraph)
}

// show brings the live reply up to the text: what was added is appended;
// a text that is not a continuation (a replaced artifact) is shown again
// whole.
func (r *a2aReply) show() {
	text := r.text()
	switch {
	case text == r.shown:
		return
	case strings.HasPrefix(text, r.shown):
		r.live.Text(text[len(r.shown):])
	default:
		r.live.Retry()
		r.live.Text(text)
	}
	r.shown = text
}

// a2aQuestion is what an A2A question keeps to send its answer: the task
// that asked.
type a2aQuestion struct {
	TaskID    string `json:"taskId"`
	ContextID string `json:"contextId"`
}

// answer is the task the step's message answers and the answer's text,
// when the step before asked a person for input: what they answered, or
// that they declined.
func (s *a2aStep) answer() (string, string, bool) {
	n := len(s.req.Steps)
	if n == 0 {
		return "", "", false
	}
	for _, q := range s.req.Steps[n-1].Questions {
		var aq a2aQuestion
		if json.Unmarshal(q.Data, &aq) != nil || aq.TaskID == "" {
			continue
		}
		switch {
		case q.Status != schema.ApprovalApproved:
			return aq.TaskID, "The user gave no answer to this question; go on without it.", true
		case len(q.Answer) == 0:
			return aq.TaskID, "yes", true
		}
		var text string
		if json.Unmarshal(q.Answer, &text) == nil {
			return aq.TaskID, text, true
		}
		return aq.TaskID, string(q.Answer), true
	}
	return "", "", false
}
