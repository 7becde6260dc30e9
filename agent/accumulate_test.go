package agent

import (
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"
)

// fragments decodes tool-call fragments as a server sends them.
func fragments(t *testing.T, raw ...string) []openai.ChatCompletionChunkChoiceDeltaToolCall {
	t.Helper()
	var out []openai.ChatCompletionChunkChoiceDeltaToolCall
	for _, r := range raw {
		var d openai.ChatCompletionChunkChoiceDeltaToolCall
		require.NoError(t, json.Unmarshal([]byte(r), &d))
		out = append(out, d)
	}
	return out
}

func TestToolCallFragmentsAreGathered(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		raw  []string
		want []toolCall
	}{
		"by index, interleaved": {
			raw: []string{
				`{"index":0,"id":"a","type":"function","function":{"name":"clock","arguments":""}}`,
				`{"index":1,"id":"b","type":"function","function":{"name":"http_get","arguments":"{\"u"}}`,
				`{"index":0,"function":{"arguments":"{}"}}`,
				`{"index":1,"function":{"arguments":"rl\":\"x\"}"}}`,
			},
			want: []toolCall{{ID: "a", Name: "clock", Arguments: "{}"}, {ID: "b", Name: "http_get", Arguments: `{"url":"x"}`}},
		},
		"no index, ID in every fragment": {
			raw: []string{
				`{"id":"a","function":{"name":"clock","arguments":"{"}}`,
				`{"id":"b","function":{"name":"weather","arguments":"{\"city\":"}}`,
				`{"id":"a","function":{"arguments":"}"}}`,
				`{"id":"b","function":{"arguments":"\"Rome\"}"}}`,
			},
			want: []toolCall{{ID: "a", Name: "clock", Arguments: "{}"}, {ID: "b", Name: "weather", Arguments: `{"city":"Rome"}`}},
		},
		"index 0 reused, a new ID starts a call": {
			raw: []string{
				`{"index":0,"id":"a","function":{"name":"clock","arguments":"{"}}`,
				`{"index":0,"function":{"arguments":"}"}}`,
				`{"index":0,"id":"b","function":{"name":"clock","arguments":"{}"}}`,
			},
			want: []toolCall{{ID: "a", Name: "clock", Arguments: "{}"}, {ID: "b", Name: "clock", Arguments: "{}"}},
		},
		"no index, ID only first": {
			raw: []string{
				`{"id":"a","function":{"name":"clock","arguments":"{"}}`,
				`{"function":{"arguments":"}"}}`,
			},
			want: []toolCall{{ID: "a", Name: "clock", Arguments: "{}"}},
		},
		"name repeated or split": {
			raw: []string{
				`{"index":0,"id":"a","function":{"name":"http","arguments":""}}`,
				`{"index":0,"function":{"name":"_get","arguments":"{}"}}`,
				`{"index":1,"id":"b","function":{"name":"clock","arguments":"{"}}`,
				`{"index":1,"function":{"name":"clock","arguments":"}"}}`,
			},
			want: []toolCall{{ID: "a", Name: "http_get", Arguments: "{}"}, {ID: "b", Name: "clock", Arguments: "{}"}},
		},
		"index first, ID later": {
			raw: []string{
				`{"index":0,"function":{"name":"clock","arguments":""}}`,
				`{"index":0,"id":"late","function":{"arguments":"{}"}}`,
			},
			want: []toolCall{{ID: "late", Name: "clock", Arguments: "{}"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var a toolCalls
			for _, d := range fragments(t, tc.raw...) {
				a.add(d)
			}
			require.Equal(t, tc.want, a.list())
		})
	}
}

func FuzzToolCallFragmentsNeverPanic(f *testing.F) {
	f.Add(`{"index":0,"id":"a","function":{"name":"x","arguments":"{"}}`, `{"function":{"arguments":"}"}}`)
	f.Fuzz(func(t *testing.T, a, b string) {
		var acc toolCalls
		for _, raw := range []string{a, b} {
			var d openai.ChatCompletionChunkChoiceDeltaToolCall
			if json.Unmarshal([]byte(raw), &d) == nil {
				acc.add(d)
			}
		}
		_ = acc.list()
	})
}
