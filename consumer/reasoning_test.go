package consumer

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// stepFunc is an agent whose steps a test writes.
type stepFunc func(ctx context.Context, req StepRequest) (Step, error)

func (f stepFunc) Step(ctx context.Context, req StepRequest) (Step, error) { return f(ctx, req) }

// recorder is a Publisher that keeps the live deltas of a run, in order.
type recorder struct {
	mu     sync.Mutex
	deltas []batonnats.LiveDelta
}

func (r *recorder) Publish(_ string, data []byte) error {
	d, err := batonnats.ParseLiveDelta(data)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deltas = append(r.deltas, d)
	return nil
}

// reply folds the deltas as a subscriber does.
func (r *recorder) reply() batonnats.LiveReply {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out batonnats.LiveReply
	for _, d := range r.deltas {
		out.Apply(d)
	}
	return out
}

func (r *recorder) types() []batonnats.DeltaType {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]batonnats.DeltaType, len(r.deltas))
	for i, d := range r.deltas {
		out[i] = d.Type
	}
	return out
}

// TestAStepsReasoningStreamsApartAndARetriedStepVoidsIt: the reasoning a
// step shows goes out as reasoning deltas, never in the reply's text; a
// step the agent tries again voids the reasoning it showed with its
// text, and keeps the earlier step's; the reply carries the steps'
// reasoning, a paragraph each, as the live reply shows it.
func TestAStepsReasoningStreamsApartAndARetriedStepVoidsIt(t *testing.T) {
	t.Parallel()
	agent := stepFunc(func(_ context.Context, req StepRequest) (Step, error) {
		switch req.Index {
		case 0:
			req.Live.Reasoning("The user wants the time: ")
			req.Live.Reasoning("ask the clock.")
			req.Live.Text("Looking.")
			return Step{Text: "Looking.", Reasoning: "The user wants the time: ask the clock.",
				Calls: []ToolCall{{ID: "c1", Tool: "clock", Arguments: json.RawMessage(`{}`)}}}, nil
		default:
			req.Live.Reasoning("It is no")
			req.Live.Text("It is no")
			// The model call failed mid-answer: the agent tries again.
			req.Live.Retry()
			req.Live.Reasoning("The clock says noon.")
			req.Live.Text("It is noon.")
			return Step{Text: "It is noon.", Reasoning: "The clock says noon."}, nil
		}
	})
	rec := &recorder{}
	tools := &scriptedTools{answer: func(ToolCall) (string, error) { return "12:00", nil }}
	reply, err := Loop{Agent: agent, Executor: tools, Tools: named("clock"), Live: rec}.Run(context.Background(),
		Turn{ConversationID: "conv", RunID: "run_1", Messages: []schema.Message{{Content: "time?"}}})
	require.NoError(t, err)
	require.Equal(t, Reply{Content: "Looking.\n\nIt is noon.", Reasoning: "The user wants the time: ask the clock.\n\nThe clock says noon."}, reply)

	live := rec.reply()
	require.Equal(t, reply.Content, live.Text(), "no reasoning in the live text")
	require.Equal(t, reply.Reasoning, live.Reasoning(), "the live reasoning is the reply's")
	// Without a journal nothing shows the tool call.
	require.Equal(t, []batonnats.LivePart{
		{Type: batonnats.PartReasoning, Text: "The user wants the time: ask the clock."},
		{Type: batonnats.PartText, Text: "Looking."},
		{Type: batonnats.PartReasoning, Text: "\n\nThe clock says noon."},
		{Type: batonnats.PartText, Text: "\n\nIt is noon."},
	}, live.Parts, "each step's reasoning comes before its text; the retried step's is gone")
	var reset *batonnats.LiveDelta
	for i, d := range rec.deltas {
		if d.Type == batonnats.DeltaReset {
			reset = &rec.deltas[i]
		}
	}
	require.NotNil(t, reset, "the retry resets the live reply: %v", rec.types())
	require.Equal(t, "Looking.", reset.Text, "the reset keeps the text that stands")
	require.Equal(t, "The user wants the time: ask the clock.", reset.Reasoning, "and the reasoning that stands")
}

// TestAStepsWholeReasoningReplacesWhatStreamedWhenItDiffers: a step that
// streamed no reasoning shows it when it returns, before its text; one
// whose final reasoning is not what streamed is shown again whole.
func TestAStepsWholeReasoningReplacesWhatStreamedWhenItDiffers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		streamed, streamedT string
	}{
		{name: "nothing streamed"},
		{name: "a start streamed", streamed: "Thin", streamedT: ""},
		{name: "other reasoning streamed", streamed: "Something else", streamedT: "Ans"},
		{name: "text before the rest of the reasoning", streamed: "Thin", streamedT: "Ans"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			agent := stepFunc(func(_ context.Context, req StepRequest) (Step, error) {
				req.Live.Reasoning(tc.streamed)
				req.Live.Text(tc.streamedT)
				return Step{Text: "Answer.", Reasoning: "Thinking."}, nil
			})
			rec := &recorder{}
			reply, err := Loop{Agent: agent, Executor: noTools{}, Live: rec}.Run(context.Background(), Turn{ConversationID: "conv", RunID: "run_1"})
			require.NoError(t, err)
			require.Equal(t, Reply{Content: "Answer.", Reasoning: "Thinking."}, reply)
			require.Equal(t, []batonnats.LivePart{{Type: batonnats.PartReasoning, Text: "Thinking."}, {Type: batonnats.PartText, Text: "Answer."}},
				rec.reply().Parts, "deltas %v", rec.types())
		})
	}
}

// TestAStoppedTurnKeepsTheReasoningItShowed: a turn stopped mid-step ends
// with the text and the reasoning it had shown, the step's unfinished
// ones included.
func TestAStoppedTurnKeepsTheReasoningItShowed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	agent := stepFunc(func(ctx context.Context, req StepRequest) (Step, error) {
		req.Live.Reasoning("Half a thought")
		req.Live.Text("Half")
		cancel(ErrStopped)
		<-ctx.Done()
		return Step{}, context.Cause(ctx)
	})
	rec := &recorder{}
	reply, err := Loop{Agent: agent, Executor: noTools{}, Live: rec}.Run(ctx, Turn{ConversationID: "conv", RunID: "run_1"})
	require.ErrorIs(t, err, ErrStopped)
	require.Equal(t, Reply{Content: "Half", Reasoning: "Half a thought"}, reply)
	require.Equal(t, "Half a thought", rec.reply().Reasoning(), "nothing voided what the stopped turn showed")
}

// TestATurnResumedAfterAnApprovalShowsTheReasoningItHadShown: the
// reasoning of the steps before a call that waited for approval is kept
// with the turn's state, shown again first when the turn resumes, and
// part of its reply.
func TestATurnResumedAfterAnApprovalShowsTheReasoningItHadShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	agent := stepFunc(func(_ context.Context, req StepRequest) (Step, error) {
		if req.Index == 0 {
			req.Live.Reasoning("Refunds need a person.")
			return Step{Text: "Refunding.", Reasoning: "Refunds need a person.",
				Calls: []ToolCall{{ID: "c1", Tool: "refund", Arguments: json.RawMessage(`{}`)}}}, nil
		}
		return Step{Text: "Done.", Reasoning: "It went through."}, nil
	})
	turn := Turn{ConversationID: "conv", RunID: "run_1", Messages: []schema.Message{{Content: "refund"}}}
	asks := &scriptedTools{answer: func(ToolCall) (string, error) { return "", ErrNeedsApproval }}
	_, err := Loop{Agent: agent, Executor: asks, Tools: named("refund")}.Run(ctx, turn)
	var suspended *Suspended
	require.ErrorAs(t, err, &suspended)

	rec := &recorder{}
	turn.RunID = "run_2"
	done := &scriptedTools{answer: func(ToolCall) (string, error) { return "refunded", nil }}
	reply, err := Loop{Agent: agent, Executor: done, Tools: named("refund"), Live: rec,
		Resume: &Resume{ApprovalID: "ap_1", ToolCallID: "c1", Tool: "refund", Status: schema.ApprovalApproved, State: suspended.State}}.Run(ctx, turn)
	require.NoError(t, err)
	require.Equal(t, Reply{Content: "Refunding.\n\nDone.", Reasoning: "Refunds need a person.\n\nIt went through."}, reply)
	require.Equal(t, batonnats.LiveDelta{RunID: "run_2", Seq: 1, Type: batonnats.DeltaReset, Text: "Refunding.", Reasoning: "Refunds need a person."},
		rec.deltas[0], "the resumed run first shows what stood")
	require.Equal(t, reply.Reasoning, rec.reply().Reasoning())
}
