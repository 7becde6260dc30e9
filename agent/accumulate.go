package agent

import (
	"github.com/openai/openai-go/v3"
)

// toolCall is a tool call as the model asked for it.
type toolCall struct {
	ID        string
	Name      string
	Arguments string
}

// toolCalls gathers the tool-call fragments of a streamed response. The
// OpenAI API sends the ID and name in a call's first fragment and its
// index in every fragment; some servers leave the index out (or send 0 for
// every call) and mark each new call with its ID instead. Fragments are
// matched by ID when they carry a known one, by index when it is present,
// and otherwise belong to the call before them.
type toolCalls struct {
	calls   []*toolCall
	byIndex map[int64]*toolCall
	byID    map[string]*toolCall
	last    *toolCall
}

func (a *toolCalls) add(d openai.ChatCompletionChunkChoiceDeltaToolCall) {
	if a.byIndex == nil {
		a.byIndex = map[int64]*toolCall{}
		a.byID = map[string]*toolCall{}
	}
	hasIndex := d.JSON.Index.Valid()
	var c *toolCall
	switch {
	case d.ID != "" && a.byID[d.ID] != nil:
		c = a.byID[d.ID]
	case d.ID != "":
		// A new ID: the call at this index, if it has no ID yet, else a
		// new call (a server that reuses the index).
		if prev := a.byIndex[d.Index]; hasIndex && prev != nil && prev.ID == "" {
			c = prev
		} else {
			c = a.newCall(d.Index, hasIndex)
		}
		c.ID = d.ID
		a.byID[d.ID] = c
	case hasIndex && a.byIndex[d.Index] != nil:
		c = a.byIndex[d.Index]
	case hasIndex || a.last == nil:
		c = a.newCall(d.Index, hasIndex)
	default:
		c = a.last
	}
	switch name := d.Function.Name; {
	case name == "" || name == c.Name:
		// Some servers repeat the whole name in every fragment.
	default:
		c.Name += name
	}
	c.Arguments += d.Function.Arguments
	a.last = c
}

func (a *toolCalls) newCall(index int64, hasIndex bool) *toolCall {
	c := &toolCall{}
	a.calls = append(a.calls, c)
	if hasIndex {
		a.byIndex[index] = c
	}
	return c
}

// list returns the calls in the order they began.
func (a *toolCalls) list() []toolCall {
	out := make([]toolCall, 0, len(a.calls))
	for _, c := range a.calls {
		out = append(out, *c)
	}
	return out
}
