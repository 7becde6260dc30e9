package agent

import (
	"encoding/json"
	"fmt"

	"github.com/batonhq/baton/consumer"
)

// savedRound is one step of the model with its tool calls, as a turn that
// stops for an approval keeps it: the results of the calls that ran.
type savedRound struct {
	Round   int        `json:"round"`
	Content string     `json:"content,omitempty"`
	Calls   []toolCall `json:"calls"`
	Results []string   `json:"results,omitempty"`
}

// turnState is what a turn keeps when it stops for an approval: enough to
// go on from the waiting call without asking the model again.
type turnState struct {
	// Version tells a resuming worker the layout.
	Version int `json:"version"`
	// Text is the reply so far: the text of the steps that stood.
	Text string `json:"text,omitempty"`
	// Rounds are the finished steps; Step is the one whose call waits.
	Rounds []savedRound `json:"rounds,omitempty"`
	Step   savedRound   `json:"step"`
	// ModelCalls counts the model calls made so far, against the budget.
	ModelCalls int `json:"model_calls"`
}

const turnStateVersion = 1

// suspend stops the turn at the first call of step without a result.
func (t *turnLoop) suspend(step savedRound) error {
	st := turnState{Version: turnStateVersion, Text: t.live.text(), Rounds: t.rounds, Step: step, ModelCalls: t.calls}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("keep the turn's state for its approval: %w", err)
	}
	next := step.Calls[len(step.Results)]
	t.log.Info().Str("tool", next.Name).Str("tool_call_id", next.ID).Msg("call waits for approval; turn stops")
	return &consumer.Suspended{State: b}
}

// restore puts back what a stopped turn kept, and returns the step whose
// call waited.
func (t *turnLoop) restore() (savedRound, error) {
	var st turnState
	if err := json.Unmarshal(t.resume.State, &st); err != nil {
		return savedRound{}, fmt.Errorf("read the state of the turn that waited for approval %s: %w", t.resume.ApprovalID, err)
	}
	if st.Version != turnStateVersion {
		return savedRound{}, fmt.Errorf("the turn that waited for approval %s kept its state in layout %d, which this worker does not read (it reads %d)", t.resume.ApprovalID, st.Version, turnStateVersion)
	}
	if len(st.Step.Results) >= len(st.Step.Calls) || st.Step.Calls[len(st.Step.Results)].ID != t.resume.ToolCallID {
		return savedRound{}, fmt.Errorf("the state of approval %s does not end at its call %s", t.resume.ApprovalID, t.resume.ToolCallID)
	}
	t.live.restore(st.Text)
	t.calls = st.ModelCalls
	for _, r := range st.Rounds {
		t.window.addRound(r.Content, r.Calls, r.Results)
		for _, c := range r.Calls {
			t.ids[c.ID] = true
		}
	}
	t.rounds = st.Rounds
	for _, c := range st.Step.Calls {
		t.ids[c.ID] = true
	}
	return st.Step, nil
}

// registryOf is a registry of a turn's tools: those an agent can declare
// to the model (the registry's own kind) are offered.
func registryOf(ts consumer.Tools) *Registry {
	r := &Registry{tools: map[string]*compiled{}}
	for name, t := range ts {
		if c, ok := t.(*compiled); ok {
			r.tools[name] = c
		}
	}
	return r
}
