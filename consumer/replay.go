package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/batonhq/baton/schema"
)

// stepJournal is an executor that journals a turn's steps: the worker's
// journal. Each step that asks for tools is journaled before its calls are
// sent, and a re-claimed turn goes on from what the journal holds.
type stepJournal interface {
	// recordStep journals the answer of step index, and makes its calls
	// the step's.
	recordStep(ctx context.Context, index int, step Step) error
	// atStep makes the calls that run next those of a journaled step.
	atStep(index int)
	// wroteBefore says that an earlier run of the turn wrote.
	wroteBefore()
}

// replay goes on from the turn's journal: each journaled step is taken as
// the agent answered it, with the results its calls have in the journal,
// and the calls of the last one that have none are made now. The agent is
// not asked again for any of them. The text and the reasoning the steps
// said are shown again as one reset, which a client that saw them from an
// earlier run already shows, and one that did not is given whole.
func (l *loop) replay(ctx context.Context) error {
	var said, thought []string
	shown := false
	show := func() {
		if !shown {
			l.live.restore(strings.Join(said, paragraph), strings.Join(thought, paragraph))
			shown = true
		}
	}
	defer show()
	for _, rec := range l.journaled {
		var step Step
		if err := json.Unmarshal(rec.Answer, &step); err != nil {
			return fmt.Errorf("read journaled step %d: %w", rec.Step, err)
		}
		step.Results = nil
		for _, c := range step.Calls {
			l.ids[c.ID] = true
		}
		for _, c := range step.Calls {
			op, ok := rec.Operations[c.ID]
			res, done, err := l.journaledResult(c, op, ok)
			if err != nil {
				return err
			}
			if !done {
				break
			}
			step.Results = append(step.Results, res)
		}
		if step.Text != "" {
			said = append(said, step.Text)
		}
		if step.Reasoning != "" {
			thought = append(thought, step.Reasoning)
		}
		l.answered(&step, rec)
		if len(step.Results) == len(step.Calls) && step.answered() {
			l.steps = append(l.steps, step)
			continue
		}
		if rec.Step != l.journaled[len(l.journaled)-1].Step {
			return fmt.Errorf("journaled step %d has calls without an outcome or questions without an answer, but later steps were journaled", rec.Step)
		}
		if j, ok := l.exec.(stepJournal); ok {
			j.atStep(rec.Step)
		}
		show()
		if err := l.finish(ctx, step); err != nil {
			return err
		}
	}
	l.log.Debug().Int("steps", len(l.steps)).Msg("turn goes on from its journal")
	return nil
}

// journaledResult is the result a journaled call had, and whether it has
// one; a call with no outcome is made again only when that cannot repeat
// a side effect.
func (l *loop) journaledResult(c ToolCall, op schema.StepOperation, journaled bool) (ToolResult, bool, error) {
	if !journaled {
		// Never started (or refused before it was): made now.
		return ToolResult{}, false, nil
	}
	if l.resume != nil && c.ID == l.resume.ToolCallID {
		// The call a person decided on: the journal answers it by the
		// decision, and shows it.
		return ToolResult{}, false, nil
	}
	if op.Effect == EffectWrite && op.Status != "awaiting_approval" && op.Status != "denied" {
		if j, ok := l.exec.(stepJournal); ok {
			j.wroteBefore()
		}
	}
	switch op.Status {
	case "completed":
		return ToolResult{Output: op.Result}, true, nil
	case "failed":
		return ToolResult{Error: strings.TrimPrefix(op.Error, op.Tool+": ")}, true, nil
	case "denied":
		status := schema.ApprovalDenied
		if strings.Contains(op.Error, "expired") {
			status = schema.ApprovalExpired
		}
		return ToolResult{Error: (&DeniedError{Tool: c.Tool, Status: status}).Error()}, true, nil
	case "started":
		if op.Effect == EffectRead {
			// A read an earlier run left unfinished: safe to make again.
			return ToolResult{}, false, nil
		}
	case "awaiting_approval":
		// The call a person decided on: the journal answers it.
		return ToolResult{}, false, nil
	}
	return ToolResult{}, false, &OutcomeUnknownError{Tool: c.Tool, Err: fmt.Errorf("call %s of the turn's journal was sent and its outcome is unknown; it is not sent again", c.ID)}
}

// answered gives the questions of a journaled step the answers a person
// gave: those the journal holds, and the one the turn resumes from.
func (l *loop) answered(step *Step, rec schema.StepRecord) {
	for i := range step.Questions {
		q := &step.Questions[i]
		if a, ok := rec.Answers[q.ID]; ok {
			q.Status, q.Answer = a.Status, a.Answer
		}
		if r := l.resume; r != nil && r.QuestionID != "" && r.QuestionID == q.ID {
			q.Status, q.Answer = r.Status, r.Answer
			l.resume = nil
		}
	}
}

// answered reports whether every question of the step has its answer.
func (s Step) answered() bool {
	for _, q := range s.Questions {
		if q.Status == "" {
			return false
		}
	}
	return true
}
