package nats_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
)

func TestLiveSubjectIsOneSubjectPerConversationAndRun(t *testing.T) {
	t.Parallel()
	for _, cid := range []string{"plain", "with.dots", "star*and>gt", "spa ce", "ünï"} {
		subject := batonnats.LiveSubject(cid, "run_0192")
		require.Equal(t, "baton.live."+batonnats.EncodeToken(cid)+".run_0192", subject)
		// Four tokens, none empty: the conversation cannot break out of
		// its token whatever characters its ID holds.
		tokens := splitDots(subject)
		require.Len(t, tokens, 4, "subject %q must have four tokens", subject)
		back, err := batonnats.DecodeToken(tokens[2])
		require.NoError(t, err)
		require.Equal(t, cid, back)
	}
	require.Equal(t, "baton.live."+batonnats.EncodeToken("c")+"."+batonnats.EncodeToken("run.with.dots"),
		batonnats.LiveSubject("c", "run.with.dots"), "an unsafe run ID must be encoded into one token")
	require.Equal(t, "baton.live."+batonnats.EncodeToken("c.1")+".*", batonnats.LiveConversationSubject("c.1"))
}

func splitDots(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func TestParseLiveEventRejectsWhatIsNotAnEvent(t *testing.T) {
	t.Parallel()
	e, err := batonnats.ParseLiveDelta([]byte(`{"run_id":"run_1","seq":3,"type":"delta","text":"hi"}`))
	require.NoError(t, err)
	require.Equal(t, batonnats.LiveDelta{RunID: "run_1", Seq: 3, Type: batonnats.DeltaText, Text: "hi"}, e)
	e, err = batonnats.ParseLiveDelta([]byte(`{"run_id":"run_1","seq":4,"type":"reasoning","text":"hm"}`))
	require.NoError(t, err)
	require.Equal(t, batonnats.LiveDelta{RunID: "run_1", Seq: 4, Type: batonnats.DeltaReasoning, Text: "hm"}, e)
	e, err = batonnats.ParseLiveDelta([]byte(`{"run_id":"run_1","seq":5,"type":"reset","text":"a","reasoning":"b"}`))
	require.NoError(t, err)
	require.Equal(t, batonnats.LiveDelta{RunID: "run_1", Seq: 5, Type: batonnats.DeltaReset, Text: "a", Reasoning: "b"}, e)
	for _, bad := range []string{`not json`, `{"run_id":"r","seq":1,"type":"shout"}`, `{"run_id":"","seq":1,"type":"done"}`, `{"run_id":"r","seq":0,"type":"done"}`} {
		_, err := batonnats.ParseLiveDelta([]byte(bad))
		require.Error(t, err, "%s must be refused", bad)
	}
}

func TestLiveTextAppliesDeltasAndResets(t *testing.T) {
	t.Parallel()
	events := []batonnats.LiveDelta{
		{Seq: 1, Type: batonnats.DeltaText, Text: "Hel"},
		{Seq: 2, Type: batonnats.DeltaText, Text: "lo wor"},
		{Seq: 3, Type: batonnats.DeltaReset, Text: "Hel"},
		{Seq: 4, Type: batonnats.DeltaText, Text: "lo, world"},
		{Seq: 5, Type: batonnats.DeltaDone},
	}
	require.Equal(t, "Hello, world", batonnats.LiveText(events))
}

// TestLiveReplyKeepsToolCallsInPlaceAcrossResets: a reset that cuts the
// text back to what stood keeps the tool calls where they came; one that
// replaces the text moves it after them.
func TestLiveReplyKeepsToolCallsInPlaceAcrossResets(t *testing.T) {
	t.Parallel()
	var r batonnats.LiveReply
	for _, d := range []batonnats.LiveDelta{
		{RunID: "run_1", Seq: 1, Type: batonnats.DeltaText, Text: "Let me look."},
		{RunID: "run_1", Seq: 2, Type: batonnats.DeltaToolInput, ToolCallID: "c1", Tool: "lookup", Input: []byte(`{"text":"x"}`)},
		{RunID: "run_1", Seq: 3, Type: batonnats.DeltaToolOutput, ToolCallID: "c1", Text: "found"},
		{RunID: "run_1", Seq: 4, Type: batonnats.DeltaText, Text: "\n\nIt is th"},
		{RunID: "run_1", Seq: 5, Type: batonnats.DeltaReset, Text: "Let me look."},
		{RunID: "run_1", Seq: 6, Type: batonnats.DeltaText, Text: "\n\nIt is there."},
	} {
		r.Apply(d)
	}
	require.Equal(t, int64(6), r.Seq)
	require.Equal(t, "Let me look.\n\nIt is there.", r.Text())
	require.Equal(t, []batonnats.LivePart{
		{Type: batonnats.PartText, Text: "Let me look."},
		{Type: batonnats.PartTool, ToolCallID: "c1", Tool: "lookup", Input: []byte(`{"text":"x"}`), State: batonnats.ToolOutputAvailable, Output: "found"},
		{Type: batonnats.PartText, Text: "\n\nIt is there."},
	}, r.Parts)

	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 7, Type: batonnats.DeltaToolInput, ToolCallID: "c2", Tool: "notify", Input: []byte(`{}`)})
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 8, Type: batonnats.DeltaToolError, ToolCallID: "c2"})
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 9, Type: batonnats.DeltaReset, Text: "Starting over"})
	require.Equal(t, "Starting over", r.Text())
	require.Equal(t, []string{batonnats.PartTool, batonnats.PartTool, batonnats.PartText}, partTypes(r.Parts), "a reset to other text keeps the tool calls and follows them")
	require.Equal(t, batonnats.ToolOutputError, r.Parts[1].State)
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 10, Type: batonnats.DeltaReset})
	require.Equal(t, "", r.Text())
	require.Len(t, r.Parts, 2, "a reset to nothing leaves only the tool calls")
}

// TestLiveReasoningFoldsIntoItsOwnPartsAndNeverJoinsTheText: reasoning
// deltas append to a reasoning part before the text they precede, a
// reasoning delta after text or a tool call starts a part of its own, and
// neither Text nor the text parts hold any of it.
func TestLiveReasoningFoldsIntoItsOwnPartsAndNeverJoinsTheText(t *testing.T) {
	t.Parallel()
	var r batonnats.LiveReply
	for _, d := range []batonnats.LiveDelta{
		{RunID: "run_1", Seq: 1, Type: batonnats.DeltaReasoning, Text: "The user wants "},
		{RunID: "run_1", Seq: 2, Type: batonnats.DeltaReasoning, Text: "the time."},
		{RunID: "run_1", Seq: 3, Type: batonnats.DeltaText, Text: "Let me look."},
		{RunID: "run_1", Seq: 4, Type: batonnats.DeltaToolInput, ToolCallID: "c1", Tool: "clock", Input: []byte(`{}`)},
		{RunID: "run_1", Seq: 5, Type: batonnats.DeltaToolOutput, ToolCallID: "c1", Text: "noon"},
		{RunID: "run_1", Seq: 6, Type: batonnats.DeltaReasoning, Text: "\n\nIt is noon."},
		{RunID: "run_1", Seq: 7, Type: batonnats.DeltaText, Text: "\n\nIt is noon."},
	} {
		r.Apply(d)
	}
	require.Equal(t, "Let me look.\n\nIt is noon.", r.Text(), "no reasoning in the text")
	require.Equal(t, "The user wants the time.\n\nIt is noon.", r.Reasoning())
	require.Equal(t, []batonnats.LivePart{
		{Type: batonnats.PartReasoning, Text: "The user wants the time."},
		{Type: batonnats.PartText, Text: "Let me look."},
		{Type: batonnats.PartTool, ToolCallID: "c1", Tool: "clock", Input: []byte(`{}`), State: batonnats.ToolOutputAvailable, Output: "noon"},
		{Type: batonnats.PartReasoning, Text: "\n\nIt is noon."},
		{Type: batonnats.PartText, Text: "\n\nIt is noon."},
	}, r.Parts)
	require.Equal(t, "Let me look.\n\nIt is noon.", batonnats.LiveText([]batonnats.LiveDelta{
		{Seq: 1, Type: batonnats.DeltaReasoning, Text: "hm"},
		{Seq: 2, Type: batonnats.DeltaText, Text: "Let me look.\n\nIt is noon."},
	}))
}

// TestAResetVoidsTheReasoningShownAfterThePointItKeeps: a retried step's
// reset carries the text and the reasoning that stand; what the step
// showed of either after them goes, what stood before stays in place,
// and a reset without reasoning (an older worker's, or a failed run's)
// leaves none.
func TestAResetVoidsTheReasoningShownAfterThePointItKeeps(t *testing.T) {
	t.Parallel()
	var r batonnats.LiveReply
	for _, d := range []batonnats.LiveDelta{
		{RunID: "run_1", Seq: 1, Type: batonnats.DeltaReasoning, Text: "First, look."},
		{RunID: "run_1", Seq: 2, Type: batonnats.DeltaText, Text: "Looking."},
		{RunID: "run_1", Seq: 3, Type: batonnats.DeltaToolInput, ToolCallID: "c1", Tool: "lookup", Input: []byte(`{}`)},
		{RunID: "run_1", Seq: 4, Type: batonnats.DeltaToolOutput, ToolCallID: "c1", Text: "found"},
		// The next step thinks and writes, then its model call is retried.
		{RunID: "run_1", Seq: 5, Type: batonnats.DeltaReasoning, Text: "\n\nIt was fou"},
		{RunID: "run_1", Seq: 6, Type: batonnats.DeltaText, Text: "\n\nFou"},
		{RunID: "run_1", Seq: 7, Type: batonnats.DeltaReset, Text: "Looking.", Reasoning: "First, look."},
	} {
		r.Apply(d)
	}
	require.Equal(t, []batonnats.LivePart{
		{Type: batonnats.PartReasoning, Text: "First, look."},
		{Type: batonnats.PartText, Text: "Looking."},
		{Type: batonnats.PartTool, ToolCallID: "c1", Tool: "lookup", Input: []byte(`{}`), State: batonnats.ToolOutputAvailable, Output: "found"},
	}, r.Parts, "the retried step's reasoning and text are void; the first step's stay where they were")

	// A reset that keeps the text but not the step's reasoning: the
	// reasoning goes even though no text does.
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 8, Type: batonnats.DeltaReasoning, Text: "\n\nHm"})
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 9, Type: batonnats.DeltaReset, Text: "Looking.", Reasoning: "First, look."})
	require.Equal(t, "First, look.", r.Reasoning())
	require.Len(t, r.Parts, 3)

	// Reasoning the reset does not begin with is replaced, after the
	// parts that stay.
	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 10, Type: batonnats.DeltaReset, Text: "Looking.", Reasoning: "Other."})
	require.Equal(t, []string{batonnats.PartText, batonnats.PartTool, batonnats.PartReasoning}, partTypes(r.Parts))
	require.Equal(t, "Other.", r.Reasoning())

	r.Apply(batonnats.LiveDelta{RunID: "run_1", Seq: 11, Type: batonnats.DeltaReset})
	require.Equal(t, []string{batonnats.PartTool}, partTypes(r.Parts), "a reset to nothing leaves no text and no reasoning")

	// A run that starts from a reset (a turn resumed after an approval)
	// shows the reasoning before the text.
	var resumed batonnats.LiveReply
	resumed.Apply(batonnats.LiveDelta{RunID: "run_2", Seq: 1, Type: batonnats.DeltaReset, Text: "Looking.", Reasoning: "First, look."})
	require.Equal(t, []batonnats.LivePart{{Type: batonnats.PartReasoning, Text: "First, look."}, {Type: batonnats.PartText, Text: "Looking."}}, resumed.Parts)

	// A type this version does not know changes nothing.
	resumed.Apply(batonnats.LiveDelta{RunID: "run_2", Seq: 2, Type: "sparkle", Text: "x"})
	require.Equal(t, int64(2), resumed.Seq)
	require.Len(t, resumed.Parts, 2)
}

func partTypes(ps []batonnats.LivePart) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Type
	}
	return out
}

func TestRunSubjectsNameTheConversationAndTheRun(t *testing.T) {
	t.Parallel()
	for _, run := range []string{"run_0192", "run with.dots"} {
		for _, subject := range []string{batonnats.StopSubject("a.b c", run), batonnats.SnapshotSubject("a.b c", run)} {
			prefix := batonnats.StopPrefix
			if subject[:len(batonnats.SnapshotPrefix)] == batonnats.SnapshotPrefix {
				prefix = batonnats.SnapshotPrefix
			}
			cid, token, err := batonnats.ParseRunSubject(prefix, subject)
			require.NoError(t, err, subject)
			require.Equal(t, "a.b c", cid)
			require.Equal(t, batonnats.RunToken(run), token)
		}
	}
	_, _, err := batonnats.ParseRunSubject(batonnats.StopPrefix, "baton.stop.Yw")
	require.Error(t, err, "a subject without a run")
}
