package consumer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton/schema"
)

// ErrNeedsApproval is what the journal answers a call that waits for a
// person's approval: the tool loop stops the turn with Suspended.
var ErrNeedsApproval = errors.New("the call waits for a person's approval")

// Suspended ends a turn that stopped at a call that needs approval
// (ErrNeedsApproval): State is what the tool loop needs to go on from that
// call, without asking the agent again, when the turn resumes.
type Suspended struct {
	State json.RawMessage
	// Question, when set, is the agent's question the turn waits for (no
	// call of Baton's waits), asked at step Step.
	Question *Question
	Step     int
}

func (s *Suspended) Error() string { return "the turn waits for a person's approval of a call" }

// Resume is a turn that goes on from a call a person decided on, or from
// an agent's question a person answered.
type Resume struct {
	// ApprovalID is the approval's public id.
	ApprovalID string
	// QuestionID is the agent's id of the question, when the turn waited
	// for one; Answer is the person's answer, if they gave one.
	QuestionID string
	Answer     json.RawMessage
	// ToolCallID and Tool are the call that waited.
	ToolCallID string
	Tool       string
	// Status is approved, denied or expired.
	Status string
	// State is what the turn kept in Suspended.
	State json.RawMessage
}

// resumeOf is the tool loop's view of a claim's approval.
func resumeOf(r *schema.Resume) *Resume {
	if r == nil {
		return nil
	}
	res := &Resume{ApprovalID: r.ApprovalID, ToolCallID: r.ToolCallID, Tool: r.Tool, Status: r.Status, State: r.State, Answer: r.Answer}
	if r.Kind == schema.ApprovalKindQuestion && r.Question != nil {
		res.QuestionID, res.ToolCallID = r.Question.ID, ""
	}
	return res
}

// DeniedError is the journal's answer to a resumed call that a person
// denied, or whose approval expired: the call was not sent. Its text is
// for the agent.
type DeniedError struct {
	Tool   string
	Status string
}

func (e *DeniedError) Error() string {
	if e.Status == schema.ApprovalExpired {
		return fmt.Sprintf("the call of %s was not made: nobody approved it in time. Tell the user, and do not call it again unless they ask", e.Tool)
	}
	return fmt.Sprintf("the call of %s was not made: the user denied it. Do not call it again unless the user asks", e.Tool)
}

// NotSentError is the journal's answer to an approved call that could not
// be sent as it was approved (its tool or its arguments changed). Its
// text is for the agent.
type NotSentError struct {
	Tool, Why string
}

func (e *NotSentError) Error() string {
	return fmt.Sprintf("the approved call of %s was not made: %s", e.Tool, e.Why)
}

// loopState is what a turn keeps when it stops for an approval: enough to
// go on from the waiting call without asking the agent again.
type loopState struct {
	// Version tells a resuming worker the layout.
	Version int `json:"version"`
	// Text is the reply so far: the text of the steps that stood;
	// Reasoning their reasoning.
	Text      string `json:"text,omitempty"`
	Reasoning string `json:"reasoning,omitempty"`
	// Steps are the completed steps; Step is the one whose call waits,
	// with the results of the calls before it.
	Steps []Step `json:"steps,omitempty"`
	Step  Step   `json:"step"`
}

// loopStateVersion is the layout this worker writes. Layout 1 is the one
// the built-in model agent kept before the tool loop was the turn
// runner's; a worker still reads it, for approvals asked before an
// upgrade.
const loopStateVersion = 2

// suspend stops the turn at the first call of step without a result, or
// at the agent's question q.
func (l *loop) suspend(step Step, q *Question) error {
	st := loopState{Version: loopStateVersion, Text: l.live.text(), Reasoning: l.live.reasoning(), Steps: l.steps, Step: step}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("keep the turn's state for its approval: %w", err)
	}
	if q != nil {
		l.log.Info().Str("question_id", q.ID).Str("reason", q.Reason).Msg("the agent asks a person; turn stops")
		return &Suspended{State: b, Question: q, Step: len(l.steps)}
	}
	next := step.Calls[len(step.Results)]
	l.log.Info().Str("tool", next.Tool).Str("tool_call_id", next.ID).Msg("call waits for approval; turn stops")
	return &Suspended{State: b, Step: len(l.steps)}
}

// restore puts back what a stopped turn kept, and returns the step whose
// call waited.
func (l *loop) restore() (Step, error) {
	r := l.resume
	st, err := readLoopState(r.State)
	if err != nil {
		return Step{}, fmt.Errorf("read the state of the turn that waited for approval %s: %w", r.ApprovalID, err)
	}
	if len(st.Step.Results) >= len(st.Step.Calls) || st.Step.Calls[len(st.Step.Results)].ID != r.ToolCallID {
		return Step{}, fmt.Errorf("the state of approval %s does not end at its call %s", r.ApprovalID, r.ToolCallID)
	}
	l.live.restore(st.Text, st.Reasoning)
	l.steps = st.Steps
	for _, s := range append(st.Steps, st.Step) {
		for _, c := range s.Calls {
			l.ids[c.ID] = true
		}
	}
	return st.Step, nil
}

// readLoopState reads a kept state of either layout.
func readLoopState(b json.RawMessage) (loopState, error) {
	var st loopState
	if err := json.Unmarshal(b, &st); err != nil {
		return st, err
	}
	switch st.Version {
	case loopStateVersion:
		return st, nil
	case 1:
		return readLoopStateV1(b)
	}
	return st, fmt.Errorf("it is in layout %d, which this worker does not read (it reads %d)", st.Version, loopStateVersion)
}

// readLoopStateV1 reads layout 1: the model's rounds, whose results are
// the text the model read.
func readLoopStateV1(b json.RawMessage) (loopState, error) {
	type call struct{ ID, Name, Arguments string }
	type round struct {
		Content string   `json:"content"`
		Calls   []call   `json:"calls"`
		Results []string `json:"results"`
	}
	var v1 struct {
		Text       string  `json:"text"`
		Rounds     []round `json:"rounds"`
		Step       round   `json:"step"`
		ModelCalls int     `json:"model_calls"`
	}
	if err := json.Unmarshal(b, &v1); err != nil {
		return loopState{}, err
	}
	step := func(r round) Step {
		s := Step{Text: r.Content}
		for _, c := range r.Calls {
			s.Calls = append(s.Calls, ToolCall{ID: c.ID, Tool: c.Name, Arguments: json.RawMessage(c.Arguments)})
		}
		for _, res := range r.Results {
			if e, ok := strings.CutPrefix(res, "error: "); ok {
				s.Results = append(s.Results, ToolResult{Error: e})
			} else {
				s.Results = append(s.Results, ToolResult{Output: res})
			}
		}
		return s
	}
	st := loopState{Version: loopStateVersion, Text: v1.Text, Step: step(v1.Step)}
	for _, r := range v1.Rounds {
		st.Steps = append(st.Steps, step(r))
	}
	// The model calls made so far count against the turn's budget.
	if len(st.Steps) > 0 {
		st.Steps[0].Requests = v1.ModelCalls
	} else {
		st.Step.Requests = v1.ModelCalls
	}
	return st, nil
}
