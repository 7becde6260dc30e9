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
