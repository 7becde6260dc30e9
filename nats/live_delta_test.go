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
