package agent

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer"
)

// events reads every event's data of a stream.
func events(t *testing.T, stream string) ([]string, error) {
	t.Helper()
	r := newSSEReader(strings.NewReader(stream))
	var out []string
	for {
		data, err := r.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(data))
	}
}

func TestTheSSEReaderReadsEventsAsTheSpecificationSays(t *testing.T) {
	t.Parallel()
	got, err := events(t, ": a comment\r\nevent: message\r\nid: 1\r\ndata: {\"a\":1}\r\n\r\n"+
		"data:no space\n\n"+
		"data: two\ndata: lines\n\n"+
		"retry: 100\n\n"+
		"data: the last event, without the blank line after it\n")
	require.NoError(t, err)
	require.Equal(t, []string{`{"a":1}`, "no space", "two\nlines", "the last event, without the blank line after it"}, got)

	got, err = events(t, "data: whole\n\ndata: cut in the midd")
	require.NoError(t, err)
	require.Equal(t, []string{"whole"}, got, "a line the stream was cut in is dropped")

	long := strings.Repeat("x", 100<<10)
	got, err = events(t, "data: "+long+"\n\n")
	require.NoError(t, err)
	require.Equal(t, []string{long}, got, "a line longer than the reader's buffer")

	_, err = events(t, "<!doctype html>\n<html></html>\n")
	var me *malformedError
	require.ErrorAs(t, err, &me, "a page is not server-sent events")
}

func TestTheCapReaderFailsPastItsBytes(t *testing.T) {
	t.Parallel()
	r := &capReader{r: strings.NewReader(strings.Repeat("a", 100)), max: 60}
	b, err := io.ReadAll(r)
	var tl *stepTooLargeError
	require.ErrorAs(t, err, &tl)
	require.Len(t, b, 60, "nothing past the cap is handed on")

	r = &capReader{r: strings.NewReader(strings.Repeat("a", 60)), max: 60}
	b, err = io.ReadAll(r)
	require.NoError(t, err, "exactly the cap is fine")
	require.Len(t, b, 60)
}

// FuzzAgentStreams reads arbitrary bytes as each protocol's stream: no
// input may panic, and what a stream shows live is its text.
func FuzzAgentStreams(f *testing.F) {
	f.Add([]byte("data: {\"type\":\"TEXT_MESSAGE_CHUNK\",\"messageId\":\"m\",\"delta\":\"hi\"}\n\ndata: {\"type\":\"RUN_FINISHED\"}\n\n"))
	f.Add([]byte("data: {\"type\":\"TOOL_CALL_CHUNK\",\"toolCallId\":\"c\",\"toolCallName\":\"weather\",\"delta\":\"{}\"}\n\ndata: {\"type\":\"TOOL_CALL_CHUNK\",\"delta\":\"x\"}\n\n"))
	f.Add([]byte("data: {\"type\":\"RUN_FINISHED\",\"outcome\":{\"type\":\"interrupt\",\"interrupts\":[{\"id\":\"i\",\"reason\":\"r\"}]}}\n\n"))
	f.Add([]byte("data: {\"type\":\"start-step\"}\n\ndata: {\"type\":\"text-delta\",\"id\":\"0\",\"delta\":\"a\"}\n\ndata: {\"type\":\"tool-input-error\",\"toolCallId\":\"c\",\"toolName\":\"weather\",\"input\":\"{x\"}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"type\":\"tool-approval-request\",\"approvalId\":\"a\",\"toolCallId\":\"c\"}\n\n: c\nevent: e\ndata: {\"type\":\"finish\",\"finishReason\":\"length\"}\n\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		for _, c := range []codec{agui{}, aisdk{}} {
			live := &textLive{}
			nop := zerolog.Nop()
			a := newAnswer(live, []consumer.ToolSpec{{Name: "weather"}}, 4, &nop)
			dec := c.decoder(a)
			r := newSSEReader(&capReader{r: strings.NewReader(string(stream)), max: 1 << 20})
			for {
				data, err := r.next()
				if err != nil {
					break
				}
				if end, err := dec.event(data); end || err != nil {
					break
				}
			}
			st := a.step()
			if st.Text != live.b.String() {
				t.Fatalf("the live text %q is not the step's %q", live.b.String(), st.Text)
			}
			if len(st.Calls) > 4 {
				t.Fatalf("%d calls past the limit of 4", len(st.Calls))
			}
			_ = a.interrupted()
		}
	})
}

// textLive keeps what a step shows.
type textLive struct{ b strings.Builder }

func (l *textLive) Text(s string)    { l.b.WriteString(s) }
func (l *textLive) Reasoning(string) {}
func (l *textLive) Retry()           { l.b.Reset() }
