package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/schema"
)

// DefaultMaxToolIterations caps the steps of a turn that ask for tools.
const DefaultMaxToolIterations = 8

// Loop is the tool loop of one turn: ask the agent for a step, run the
// calls it asks for, ask for the next step with their results, until a
// step asks for none. A worker runs it for every turn, with its journal
// as the Executor; Loop runs it without a worker, for tests of an agent
// and for programs that drive an agent themselves.
type Loop struct {
	// Agent answers the steps. Required.
	Agent Agent
	// Tools are the turn's tools: those that declare themselves
	// (DeclaredTool) are offered to the agent, and each call is checked
	// against them before it goes to the Executor. Defaults to none.
	Tools Tools
	// Executor runs the calls. Required.
	Executor ToolExecutor
	// MaxToolIterations caps the steps that ask for tools; the step after
	// the last ends the turn with ErrToolIterations. Defaults to
	// DefaultMaxToolIterations.
	MaxToolIterations int
	// Live receives the reply while it is written, on the run's live
	// subject (a *nats.Conn fits). Defaults to none: nothing is published.
	Live Publisher
	// Resume, when set, goes on from the call a turn stopped at for a
	// person's approval: the Executor answers that call by the decision.
	// Defaults to none.
	Resume *Resume
	// Logger receives the loop's logs. Defaults to no logging.
	Logger *zerolog.Logger
}

// Run runs the turn's steps and returns its reply. A turn stopped by its
// context with the cause ErrStopped returns ErrStopped with the reply it
// had shown, its text and its reasoning, as a worker keeps it.
func (l Loop) Run(ctx context.Context, turn Turn) (Reply, error) {
	switch {
	case l.Agent == nil:
		return Reply{}, errors.New("consumer: Loop.Agent is nil: give an agent")
	case l.Executor == nil:
		return Reply{}, errors.New("consumer: Loop.Executor is nil: give what runs the tools")
	}
	log := zerolog.Nop()
	if l.Logger != nil {
		log = *l.Logger
	}
	max := l.MaxToolIterations
	if max == 0 {
		max = DefaultMaxToolIterations
	}
	live := newLiveRun(l.Live, turn.ConversationID, turn.RunID, log)
	lp := newLoop(l.Agent, &turn, l.Tools, l.Executor, live, max, log)
	lp.resume = l.Resume
	reply, err := lp.run(ctx)
	if errors.Is(err, ErrStopped) {
		reply = live.stopped()
	}
	return reply, err
}

// ErrToolIterations ends a turn whose agent was still asking for tools
// after Config.MaxToolIterations steps.
var ErrToolIterations = errors.New("the turn used all the steps with tool calls it may use")

// stepBudgetError is ErrToolIterations with the texts the operator and the
// user read. It is terminal: another attempt would do the same.
type stepBudgetError struct{ max int }

func (e *stepBudgetError) Error() string {
	return fmt.Sprintf("the agent was still calling tools after %d steps, the most a turn may use (BATON_MAX_TOOL_ITERATIONS, --max-tool-iterations): raise it if turns need more", e.max)
}
func (e *stepBudgetError) Unwrap() error         { return ErrToolIterations }
func (e *stepBudgetError) Terminal() bool        { return true }
func (e *stepBudgetError) FailureReason() string { return "budget_exceeded" }
func (e *stepBudgetError) UserText() string {
	return "The assistant needed too many steps for this message and stopped. Try asking for less at a time."
}

// ErrEmptyReply ends a turn whose agent answered with no text and no tool
// call, when the agent says nothing more precise itself.
var ErrEmptyReply = errors.New("the agent answered with no text and no tool call")

// emptyReplyError is ErrEmptyReply, terminal: another attempt would likely
// do the same.
type emptyReplyError struct{}

func (emptyReplyError) Error() string         { return ErrEmptyReply.Error() }
func (emptyReplyError) Unwrap() error         { return ErrEmptyReply }
func (emptyReplyError) Terminal() bool        { return true }
func (emptyReplyError) FailureReason() string { return "empty_reply" }
func (emptyReplyError) UserText() string {
	return "The assistant gave an empty answer. Try rephrasing your message."
}

// loop is the state of one turn's tool loop.
type loop struct {
	agent    Agent
	turn     *Turn
	tools    Tools
	specs    []ToolSpec
	exec     ToolExecutor
	live     *stepLive
	maxTools int
	log      zerolog.Logger
	// resume is the approval the turn resumes from, until its call was
	// answered.
	resume *Resume
	// journaled are the turn's steps an earlier run journaled: the loop
	// goes on after them.
	journaled []schema.StepRecord

	// steps are the turn's completed steps; ids the tool call IDs given
	// to the executor so far.
	steps []Step
	ids   map[string]bool
}

func newLoop(agent Agent, turn *Turn, tools Tools, exec ToolExecutor, live *liveRun, maxTools int, log zerolog.Logger) *loop {
	l := &loop{agent: agent, turn: turn, tools: tools, exec: exec, live: &stepLive{run: live}, maxTools: maxTools, log: log, ids: map[string]bool{}}
	for _, t := range tools {
		if d, ok := t.(DeclaredTool); ok {
			l.specs = append(l.specs, d.Spec())
		}
	}
	slices.SortFunc(l.specs, func(a, b ToolSpec) int { return strings.Compare(a.Name, b.Name) })
	return l
}

// run runs the steps until one asks for no tool. A turn that resumes from
// an approval first finishes the step whose call waited.
func (l *loop) run(ctx context.Context) (Reply, error) {
	if l.turn.Attempt > 1 {
		// Subscribers of the conversation drop what an earlier attempt
		// showed.
		l.live.clear()
	}
	reply, err := l.runSteps(ctx)
	var suspended *Suspended
	switch {
	case errors.As(err, &suspended), errors.Is(err, ErrStopped):
		// A turn that waits for an approval keeps what it showed (the
		// turn that resumes shows it again), and so does a stopped one:
		// that is its reply, also when the stop comes as it waits.
	case err != nil:
		l.live.failed()
	default:
		l.live.done()
	}
	return reply, err
}

func (l *loop) runSteps(ctx context.Context) (Reply, error) {
	switch {
	case len(l.journaled) > 0:
		if err := l.replay(ctx); err != nil {
			return Reply{}, err
		}
	case l.resume != nil:
		// An approval asked before the journal of steps: the state the
		// turn kept.
		step, err := l.restore()
		if err != nil {
			return Reply{}, err
		}
		if err := l.finish(ctx, step); err != nil {
			return Reply{}, err
		}
	}
	for {
		index := len(l.steps)
		step, err := l.agent.Step(ctx, StepRequest{Turn: l.turn, Index: index, Steps: l.steps, Tools: l.specs, Live: l.live})
		if err != nil {
			if ctx.Err() != nil {
				return Reply{}, context.Cause(ctx)
			}
			return Reply{}, err
		}
		l.live.commit(step.Text, step.Reasoning)
		text := l.live.text()
		switch {
		case step.Truncated && text == "":
			return Reply{}, emptyReplyError{}
		case step.Truncated:
			l.log.Info().Int("tool_calls_dropped", len(step.Calls)).Msg("reply cut off at the agent's output limit")
			return Reply{Content: text, Reasoning: l.live.reasoning(), Truncated: true}, nil
		case len(step.Calls) == 0 && len(step.Questions) == 0 && text == "":
			return Reply{}, emptyReplyError{}
		case len(step.Calls) == 0 && len(step.Questions) == 0:
			return Reply{Content: text, Reasoning: l.live.reasoning()}, nil
		case index >= l.maxTools:
			return Reply{}, &stepBudgetError{max: l.maxTools}
		}
		step.Calls, step.Results = l.identify(index, step.Calls), nil
		for i := range step.Questions {
			step.Questions[i].Status, step.Questions[i].Answer = "", nil
		}
		if j, ok := l.exec.(stepJournal); ok {
			// Journaled before any of its calls is sent: a re-claim goes
			// on from here instead of asking the agent again.
			if err := j.recordStep(ctx, index, step); err != nil {
				return Reply{}, err
			}
		}
		if err := l.finish(ctx, step); err != nil {
			return Reply{}, err
		}
	}
}

// finish runs the calls of a step that have no result yet, in order, and
// keeps the step once its questions are answered too. A call that waits
// for a person's approval, or a question of the agent's without an
// answer, stops the turn there (*Suspended), with what it needs to go on
// from that point.
func (l *loop) finish(ctx context.Context, step Step) error {
	for i := len(step.Results); i < len(step.Calls); i++ {
		if q := step.questionAbout(step.Calls[i].ID); q != nil {
			// The agent asked a person about this call first: it runs
			// only once they approved it.
			if q.Status == "" {
				return l.suspend(step, q)
			}
			if q.Status != schema.ApprovalApproved {
				step.Results = append(step.Results, ToolResult{Error: (&DeniedError{Tool: step.Calls[i].Tool, Status: q.Status}).Error()})
				continue
			}
		}
		res, err := l.call(ctx, step.Calls[i])
		if errors.Is(err, ErrNeedsApproval) {
			return l.suspend(step, nil)
		}
		if err != nil {
			return err
		}
		step.Results = append(step.Results, res)
	}
	for i := range step.Questions {
		if step.Questions[i].Status == "" {
			return l.suspend(step, &step.Questions[i])
		}
	}
	l.steps = append(l.steps, step)
	return nil
}

// identify gives each call of a step an ID that is unique in the turn,
// which the journal requires and from which a write's idempotency key is
// derived. Agents that give no ID, or the same ones each step, get
// deterministic ones.
func (l *loop) identify(index int, calls []ToolCall) []ToolCall {
	out := make([]ToolCall, len(calls))
	for i, c := range calls {
		if c.ID == "" || l.ids[c.ID] {
			c.ID = fmt.Sprintf("call_r%d_%d", index+1, i+1)
			for n := 2; l.ids[c.ID]; n++ {
				c.ID = fmt.Sprintf("call_r%d_%d_%d", index+1, i+1, n)
			}
		}
		l.ids[c.ID] = true
		out[i] = c
	}
	return out
}

// call runs one call and returns what the agent gets back. A call the
// agent got wrong (unknown tool, broken or invalid arguments), a tool's
// own failure and a call a person did not approve are answers for the
// agent; only an error of the journal (lost lease, deleted conversation,
// database) or a tool's outcome that cannot be known ends the turn.
func (l *loop) call(ctx context.Context, c ToolCall) (ToolResult, error) {
	log := l.log.With().Str("tool", c.Tool).Str("tool_call_id", c.ID).Logger()
	if args := strings.TrimSpace(string(c.Arguments)); args == "" {
		c.Arguments = json.RawMessage(`{}`)
	} else {
		c.Arguments = json.RawMessage(args)
	}
	if l.resume != nil && c.ID == l.resume.ToolCallID {
		// The call a person decided on: the journal answers it by the
		// decision, with the arguments it stored.
		l.resume = nil
	} else if refusal := l.check(c); refusal != "" {
		log.Info().Str("refusal", refusal).Msg("agent called a tool wrongly")
		return ToolResult{Error: refusal}, nil
	}
	out, err := l.exec.Call(ctx, c)
	var te *ToolError
	var denied *DeniedError
	var notSent *NotSentError
	switch {
	case errors.As(err, &denied), errors.As(err, &notSent):
		log.Info().Err(err).Msg("call not made")
		return ToolResult{Error: err.Error()}, nil
	case errors.As(err, &te):
		log.Info().Err(te.Err).Msg("tool failed")
		return ToolResult{Error: te.Err.Error()}, nil
	case errors.Is(err, ErrUnknownTool):
		return ToolResult{}, fmt.Errorf("tool %q is offered to the agent but the journal does not have it: give the executor the same tools: %w", c.Tool, err)
	case err != nil:
		return ToolResult{}, err
	}
	log.Debug().Msg("tool completed")
	return ToolResult{Output: out}, nil
}

// check refuses a call of a tool the turn does not have, or with
// arguments its schema does not take: the refusal, written for the
// agent, or "".
func (l *loop) check(c ToolCall) string {
	tool, ok := l.tools[c.Tool]
	if !ok {
		names := make([]string, 0, len(l.tools))
		for n := range l.tools {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Sprintf("there is no tool %q; the tools are: %s", c.Tool, strings.Join(names, ", "))
	}
	if d, ok := tool.(DeclaredTool); ok {
		if err := d.Validate(c.Arguments); err != nil {
			return err.Error()
		}
	}
	return ""
}

// questionAbout is the step's question about its call id, or nil.
func (s *Step) questionAbout(callID string) *Question {
	for i := range s.Questions {
		if q := &s.Questions[i]; q.ToolCallID != "" && q.ToolCallID == callID {
			return q
		}
	}
	return nil
}
