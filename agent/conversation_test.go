package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

// conversation is a long conversation made on demand, as the turn runner
// would read it from Postgres: message Seq 1 to n, a user's and the
// assistant's in turn, each of about size bytes. It holds no message, so
// a test's memory figures are the agent's.
type conversation struct {
	n    int64
	size int

	mu sync.Mutex
	// pages and rows count the reads through MoreHistory.
	pages, rows int
}

func (c *conversation) message(seq int64) schema.Message {
	role := schema.RoleUser
	if seq%2 == 0 {
		role = schema.RoleAssistant
	}
	head := fmt.Sprintf("message %d: ", seq)
	return schema.Message{
		ID: fmt.Sprintf("m%d", seq), ConversationID: "conv", Role: role, Seq: seq,
		Content: head + strings.Repeat("lorem ipsum ", max(c.size-len(head), 0)/12),
	}
}

// turn is a turn of one user message after the conversation, with the
// newest historyLimit messages as History, as the turn runner gives them.
func (c *conversation) turn(text string, historyLimit int) consumer.Turn {
	turn := consumer.Turn{
		ConversationID: "conv", RunID: "run_test", TurnID: "turn_test", Attempt: 1,
		Messages: []schema.Message{{ID: "turn", ConversationID: "conv", Role: schema.RoleUser, Content: text, Seq: c.n + 1}},
		MoreHistory: func(_ context.Context, beforeSeq int64, limit int) ([]schema.Message, error) {
			var out []schema.Message
			for seq := beforeSeq - 1; seq >= 1 && len(out) < limit; seq-- {
				out = append(out, c.message(seq))
			}
			c.mu.Lock()
			c.pages++
			c.rows += len(out)
			c.mu.Unlock()
			return out, nil
		},
	}
	for seq := max(c.n-int64(historyLimit)+1, 1); seq <= c.n; seq++ {
		turn.History = append(turn.History, c.message(seq))
	}
	return turn
}

func (c *conversation) reads() (pages, rows int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pages, c.rows
}

// requestTokens is the estimated size of a request the server received,
// counted as the agent documents it (EstimateTokens and the overheads).
func requestTokens(req agenttest.Request) int {
	n := agent.TokensPerRequest
	for _, tool := range req.Tools {
		b, _ := json.Marshal(tool)
		n += agent.TokensPerTool + agent.EstimateTokens(string(b))
	}
	for _, m := range req.Messages {
		n += agent.TokensPerMessage + agent.EstimateTokens(m.Text()) + agent.EstimateTokens(m.ToolCallID)
		for _, c := range m.ToolCalls {
			n += agent.TokensPerToolCall + agent.EstimateTokens(c.ID) + agent.EstimateTokens(c.Function.Name) + agent.EstimateTokens(c.Function.Arguments)
		}
	}
	return n
}

// lookup is a read tool whose result is size bytes.
func lookup(size int) agent.Tool {
	result := "result start " + strings.Repeat("data ", size/5) + " result end"
	return agent.Tool{
		Name:        "lookup",
		Description: "Looks a thing up.",
		Schema:      []byte(`{"type":"object","properties":{"q":{"type":"string"}}}`),
		Effect:      agent.Read,
		Handler:     func(context.Context, agent.Invocation) (string, error) { return result, nil },
	}
}

// toolTurns answers each turn with rounds rounds of calls tool calls,
// then a reply; check sees every request and where in its turn it is.
func toolTurns(rounds, calls int, check func(n, step int, req agenttest.Request)) agenttest.Responder {
	return func(n int, req agenttest.Request) agenttest.Response {
		step := n % (rounds + 1)
		if check != nil {
			check(n, step, req)
		}
		if step == rounds {
			return agenttest.Response{Content: "All looked up."}
		}
		res := agenttest.Response{}
		for j := range calls {
			res.ToolCalls = append(res.ToolCalls, agenttest.ToolCall{ID: fmt.Sprintf("call_%d_%d", n, j), Name: "lookup", Arguments: `{"q":"x"}`})
		}
		return res
	}
}
