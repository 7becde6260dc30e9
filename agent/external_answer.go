package agent

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/consumer"
)

// codec is one protocol of external agents: what a step's request says,
// and how the events of its answer are read. A codec only translates: the
// retries, the limits, the timeouts and the turn's journal are the same
// for every protocol.
type codec interface {
	// body is the request of a step, to be sent as JSON.
	body(in stepInput) any
	// decoder reads the events of one answer into a.
	decoder(a *answer) eventDecoder
	// endEvent names the event that ends a step, for the operator's
	// text about a stream that ended without it.
	endEvent() string
}

// eventDecoder reads the events of one answer, in order.
type eventDecoder interface {
	// event reads the data of one event. end reports the step's last
	// event: what follows it is not read.
	event(data []byte) (end bool, err error)
}

// stepInput is what a step's request is made of.
type stepInput struct {
	req    consumer.StepRequest
	thread string
	key    string
	// files are the links to the messages' files, by message key.
	files map[string][]fileLink
}

// runFailure is a failure the agent reported in its stream (AG-UI
// RUN_ERROR, an AI SDK error or abort chunk): retried like a failed model
// call.
type runFailure struct{ what string }

func (e *runFailure) Error() string { return e.what }

// tooManyCallsError is a step that asked for more than MaxToolCalls calls
// of declared tools.
type tooManyCallsError struct{ max int }

func (e *tooManyCallsError) Error() string {
	return fmt.Sprintf("the step asked for more than %d tool calls", e.max)
}

// answer is what the events of one step request said so far: the text
// and the reasoning, streamed to the live reply as they arrive, and the
// tool calls, whole once the step ends.
type answer struct {
	live     consumer.StepLive
	declared map[string]bool
	maxCalls int
	log      *zerolog.Logger

	text strings.Builder
	// textID is the id of the text message being written: a text of
	// another message starts a new paragraph.
	textID    string
	reasoning strings.Builder
	// reasoningID is textID for the reasoning.
	reasoningID string
	calls       []*agentCall
	byID        map[string]*agentCall
	// asked counts the calls of declared tools.
	asked      int
	interrupts []Interrupt
	// truncated and filtered are set by an AI SDK finish whose reason is
	// "length" or "content-filter".
	truncated, filtered bool
}

// agentCall is a tool call as the agent's events write it.
type agentCall struct {
	id, tool string
	args     strings.Builder
	// input is the whole input, when an event gave it so; otherwise the
	// arguments are what args gathered.
	input json.RawMessage
	// declared is set for a tool Baton declared; ran once the agent sent
	// the call's result or said it ran the call itself.
	declared, ran bool
}

func (c *agentCall) arguments() json.RawMessage {
	if c.input != nil {
		return c.input
	}
	return json.RawMessage(c.args.String())
}

func newAnswer(live consumer.StepLive, tools []consumer.ToolSpec, maxCalls int, log *zerolog.Logger) *answer {
	a := &answer{live: live, declared: make(map[string]bool, len(tools)), maxCalls: maxCalls, log: log, byID: map[string]*agentCall{}}
	for _, t := range tools {
		a.declared[t.Name] = true
	}
	return a
}

// addText appends a piece of the text of message id ("" for the message
// being written), and shows it.
func (a *answer) addText(id, delta string) {
	if delta == "" {
		return
	}
	if id != "" && id != a.textID {
		if a.text.Len() > 0 && !strings.HasSuffix(a.text.String(), "\n") {
			a.writeText(paragraph)
		}
		a.textID = id
	}
	a.writeText(delta)
}

func (a *answer) writeText(s string) {
	a.text.WriteString(s)
	a.live.Text(s)
}

// addReasoning appends a piece of the reasoning of message id ("" for the
// one being written), and shows it: the reasoning of another message is a
// paragraph of its own, as its text is.
func (a *answer) addReasoning(id, delta string) {
	if delta == "" {
		return
	}
	if id != "" && id != a.reasoningID {
		if a.reasoning.Len() > 0 && !strings.HasSuffix(a.reasoning.String(), "\n") {
			a.writeReasoning(paragraph)
		}
		a.reasoningID = id
	}
	a.writeReasoning(delta)
}

func (a *answer) writeReasoning(s string) {
	a.reasoning.WriteString(s)
	a.live.Reasoning(s)
}

// paragraph separates the texts of an agent's messages within a step.
const paragraph = "\n\n"

// startCall returns the call with id, started now if it is new.
func (a *answer) startCall(id, tool string) (*agentCall, error) {
	if c, ok := a.byID[id]; ok {
		if c.tool == "" {
			c.tool = tool
		}
		return c, nil
	}
	c := &agentCall{id: id, tool: tool, declared: a.declared[tool]}
	if c.declared {
		a.asked++
		if a.asked > a.maxCalls {
			return nil, &tooManyCallsError{max: a.maxCalls}
		}
	}
	a.calls = append(a.calls, c)
	a.byID[id] = c
	return c, nil
}

// ran records that the agent ran call id itself: it sent its result.
func (a *answer) ran(id string) {
	if c, ok := a.byID[id]; ok {
		c.ran = true
		return
	}
	a.log.Debug().Str("tool_call_id", id).Msg("the agent sent the result of a tool call it did not show")
}

// step is the answer as a step: its text, its reasoning and the calls of
// declared tools that the agent did not run itself. The agent's own tools are outside
// the journal: they are logged, never returned.
func (a *answer) step() consumer.Step {
	st := consumer.Step{Text: a.text.String(), Reasoning: a.reasoning.String()}
	own := 0
	for _, c := range a.calls {
		switch {
		case c.declared && !c.ran:
			st.Calls = append(st.Calls, consumer.ToolCall{ID: c.id, Tool: c.tool, Arguments: c.arguments()})
		case c.declared:
			// Baton would have journaled and run it; the agent did,
			// outside the journal.
			own++
			a.log.Warn().Str("tool", c.tool).Str("tool_call_id", c.id).Msg("the agent ran a tool that Baton declares itself: its effect is outside the journal")
		case c.ran:
			own++
			a.log.Debug().Str("tool", c.tool).Str("tool_call_id", c.id).Msg("the agent ran a tool of its own")
		default:
			a.log.Warn().Str("tool", c.tool).Str("tool_call_id", c.id).Msg("the agent asked for a tool that Baton does not declare and did not run it: left out")
		}
	}
	a.log.Debug().Int("text_bytes", len(st.Text)).Int("reasoning_bytes", a.reasoning.Len()).Int("tool_calls", len(st.Calls)).Int("own_tool_calls", own).Msg("agent step answered")
	return st
}

// interrupted returns the interrupts, each with the call it names when
// the step wrote it.
func (a *answer) interrupted() []Interrupt {
	out := append([]Interrupt(nil), a.interrupts...)
	for i, in := range out {
		if c, ok := a.byID[in.ToolCallID]; ok && in.ToolCallID != "" {
			out[i].Tool, out[i].Arguments = c.tool, c.arguments()
		}
	}
	return out
}
