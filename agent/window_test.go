package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/schema"
)

const systemPrompt = "You are a helpful assistant."

// TestEveryRequestOfALongConversationStaysWithinTheBudget: a conversation
// of 2,000 messages of about 1,000 tokens each (2 M tokens in all), and
// turns of 10 rounds of 10 tool calls whose results (20 KiB each) are over
// the cap: every request the server receives is within the budget, starts
// with the system prompt, holds the turn's message whole and the newest
// round's results, and some history; no page beyond Turn.History is read.
func TestEveryRequestOfALongConversationStaysWithinTheBudget(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		conv := &conversation{n: 2000, size: 3000}
		const rounds, calls = 10, 10
		var mu sync.Mutex
		var most, leastHistory = 0, 1 << 30
		question := "Look these up and sum them."
		srv := agenttest.NewResponder(t, toolTurns(rounds, calls, func(n, step int, req agenttest.Request) {
			tokens := requestTokens(req)
			if tokens > agent.DefaultContextTokens {
				t.Errorf("request %d holds %d estimated tokens, over the budget of %d", n, tokens, agent.DefaultContextTokens)
			}
			if req.Messages[0].Role != "system" || req.Messages[0].Text() != systemPrompt {
				t.Errorf("request %d does not start with the system prompt", n)
			}
			turnAt := -1
			for i, m := range req.Messages {
				if m.Role == "user" && m.Text() == question {
					turnAt = i
				}
			}
			if turnAt < 0 {
				t.Errorf("request %d lacks the turn's message", n)
				return
			}
			if step > 0 {
				results := req.ToolMessages()
				for j := range calls {
					id := fmt.Sprintf("call_%d_%d", n-1, j)
					if !strings.HasPrefix(results[id], "result start ") || !strings.HasSuffix(results[id], " result end") {
						t.Errorf("request %d: the newest round's result %s is missing or lost its start or end", n, id)
					}
				}
			}
			mu.Lock()
			most = max(most, tokens)
			leastHistory = min(leastHistory, turnAt-1)
			mu.Unlock()
		}))
		reg := agent.NewRegistry(lookup(20 << 10))
		a := newAgent(t, srv, func(c *agent.Config) {
			c.DisableStreaming = !streaming
			c.SystemPrompt = systemPrompt
			c.MaxModelCalls = rounds + 1
		})
		ex := func() *executor {
			ex := newExecutor(reg)
			ex.maxTools = rounds
			return ex
		}
		turn := conv.turn(question, consumer.DefaultHistoryLimit)
		stored := append([]schema.Message(nil), turn.History...)
		for range 2 {
			reply, err := run(context.Background(), a, turn, ex())
			require.NoError(t, err)
			require.Equal(t, "All looked up.", reply.Content)
		}
		require.Equal(t, 2*(rounds+1), srv.Count())
		require.Equal(t, stored, turn.History, "the stored conversation is never changed")
		pages, _ := conv.reads()
		require.Zero(t, pages, "History held more than the budget: nothing more is read")
		require.LessOrEqual(t, most, agent.DefaultContextTokens)
		require.Greater(t, most, agent.DefaultContextTokens*9/10, "the budget is used, not wasted")
		require.GreaterOrEqual(t, leastHistory, 6, "the newest history keeps its share beside many tool results")
		t.Logf("largest request: %d estimated tokens; fewest history messages in a request: %d", most, leastHistory)
	})
}

// TestHistoryIsReadAPageAtATimeOnlyWhileTheBudgetHasRoom: a conversation
// of 20,000 short messages is read past Turn.History a page at a time,
// newest first, until the budget is full, and no further.
func TestHistoryIsReadAPageAtATimeOnlyWhileTheBudgetHasRoom(t *testing.T) {
	t.Parallel()
	conv := &conversation{n: 20000, size: 30}
	var sent agenttest.Request
	srv := agenttest.NewResponder(t, func(_ int, req agenttest.Request) agenttest.Response {
		sent = req
		return agenttest.Response{Content: "ok"}
	})
	a := newAgent(t, srv, nil)
	_, err := run(context.Background(), a, conv.turn("and now?", consumer.DefaultHistoryLimit), newExecutor(agent.NewRegistry()))
	require.NoError(t, err)

	history := len(sent.Messages) - 1
	require.LessOrEqual(t, requestTokens(sent), agent.DefaultContextTokens)
	require.Greater(t, requestTokens(sent), agent.DefaultContextTokens-50, "the history fills the budget")
	// Oldest first, ending with the newest message before the turn.
	require.Equal(t, conv.message(conv.n).Content, sent.Messages[history-1].Text())
	require.Equal(t, conv.message(conv.n-int64(history)+1).Content, sent.Messages[0].Text())
	pages, rows := conv.reads()
	require.Greater(t, pages, 1, "the budget had room for more than one page")
	require.Less(t, rows+consumer.DefaultHistoryLimit-history, 256, "at most a page is read beyond what the request holds")
	t.Logf("history sent: %d messages; read through MoreHistory: %d rows in %d pages, of %d", history, rows, pages, conv.n)
}

// TestAShortConversationIsSentWholeWithoutBatonsWords: every message of
// a short conversation goes, oldest first; Baton's error messages do not.
func TestAShortConversationIsSentWholeWithoutBatonsWords(t *testing.T) {
	t.Parallel()
	conv := &conversation{n: 30, size: 30}
	turn := conv.turn("and now?", consumer.DefaultHistoryLimit)
	turn.History[5].Role = schema.RoleError
	srv := agenttest.NewServer(t, agenttest.Response{Content: "ok"})
	a := newAgent(t, srv, nil)
	_, err := run(context.Background(), a, turn, newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	req := srv.Requests()[0]
	require.Len(t, req.Messages, 30, "29 earlier messages and the turn's")
	for i, m := range req.Messages[:29] {
		seq := int64(i + 1)
		if seq >= 6 {
			seq++
		}
		require.Equal(t, conv.message(seq).Content, m.Text())
	}
	pages, rows := conv.reads()
	require.LessOrEqual(t, pages, 1, "one look for older messages, which finds none")
	require.Zero(t, rows)
}

// TestATurnOverTheBudgetIsCutOldestFirstAndTheNewestKept: a turn of three
// messages larger than the budget: the oldest is cut with a marker, the
// newest sent whole, the stored messages unchanged.
func TestATurnOverTheBudgetIsCutOldestFirstAndTheNewestKept(t *testing.T) {
	t.Parallel()
	long := func(name string) string {
		return name + " begins. " + strings.Repeat("words ", 1500) + name + " ends."
	}
	turn := turnOf("x")
	turn.Messages = []schema.Message{
		{Role: schema.RoleUser, Content: long("first")},
		{Role: schema.RoleUser, Content: long("second")},
		{Role: schema.RoleUser, Content: "Which of these is longer?"},
	}
	stored := append([]schema.Message(nil), turn.Messages...)
	srv := agenttest.NewServer(t, agenttest.Response{Content: "The same."})
	a := newAgent(t, srv, func(c *agent.Config) { c.ContextTokens = 4000 })
	_, err := run(context.Background(), a, turn, newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	require.Equal(t, stored, turn.Messages)

	req := srv.Requests()[0]
	require.LessOrEqual(t, requestTokens(req), 4000)
	require.Equal(t, "user user user", req.Roles())
	first, second, newest := req.Messages[0].Text(), req.Messages[1].Text(), req.Messages[2].Text()
	require.Equal(t, "Which of these is longer?", newest)
	require.Equal(t, long("second"), second, "the newer message stays whole while cutting the older one is enough")
	require.True(t, strings.HasPrefix(first, "first begins. "), first)
	require.True(t, strings.HasSuffix(first, " first ends."), first)
	require.Regexp(t, `\n\[\.\.\. [0-9]+ bytes left out to fit the model's context \.\.\.\]\n`, first)
	require.Less(t, len(first), len(long("first")))
}

// TestANewestMessageLargerThanTheBudgetIsCutNotRefused.
func TestANewestMessageLargerThanTheBudgetIsCutNotRefused(t *testing.T) {
	t.Parallel()
	huge := "Start. " + strings.Repeat("éàü ", 20000) + "What is this?"
	srv := agenttest.NewServer(t, agenttest.Response{Content: "Vowels."})
	a := newAgent(t, srv, func(c *agent.Config) { c.ContextTokens = 2000 })
	reply, err := run(context.Background(), a, turnOf(huge), newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	require.Equal(t, "Vowels.", reply.Content)
	req := srv.Requests()[0]
	require.LessOrEqual(t, requestTokens(req), 2000)
	text := req.LastUser()
	require.True(t, strings.HasPrefix(text, "Start. "))
	require.True(t, strings.HasSuffix(text, "What is this?"))
	require.Contains(t, text, "bytes left out to fit the model's context")
}

// TestToolResultsAreCappedForTheModelAndWholeForTheJournal.
func TestToolResultsAreCappedForTheModelAndWholeForTheJournal(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t,
			agenttest.Response{ToolCalls: []agenttest.ToolCall{{ID: "call_1", Name: "lookup", Arguments: `{"q":"x"}`}}},
			agenttest.Response{Content: "done"},
		)
		tool := lookup(40000)
		reg := agent.NewRegistry(tool)
		a := newAgent(t, srv, func(c *agent.Config) { c.DisableStreaming = !streaming; c.MaxToolResultBytes = 1024 })
		ex := &recorder{executor: newExecutor(reg)}
		_, err := run(context.Background(), a, turnOf("look it up"), ex)
		require.NoError(t, err)
		whole := ex.outputs[0]
		require.Greater(t, len(whole), 40000, "the journal gets the whole result")
		sent := srv.Requests()[1].ToolMessages()["call_1"]
		require.LessOrEqual(t, len(sent), 1024)
		require.True(t, strings.HasPrefix(sent, "result start "))
		require.True(t, strings.HasSuffix(sent, " result end"))
		require.Contains(t, sent, "bytes left out to fit the model's context")
	})
}

// recorder keeps what tools returned.
type recorder struct {
	*executor
	outputs []string
}

func (r *recorder) Call(ctx context.Context, c consumer.ToolCall) (string, error) {
	out, err := r.executor.Call(ctx, c)
	r.outputs = append(r.outputs, out)
	return out, err
}

// TestATurnThatCannotFitFailsWithoutACall: tools registered after the
// agent was made take the whole budget; the turn fails at once, terminal,
// without a request larger than the budget.
func TestATurnThatCannotFitFailsWithoutACall(t *testing.T) {
	t.Parallel()
	reg := agent.NewRegistry()
	srv := agenttest.NewServer(t)
	a := newAgent(t, srv, func(c *agent.Config) { c.ContextTokens = 1100 })
	require.NoError(t, reg.Register(agent.Tool{
		Name: "big", Description: strings.Repeat("A tool with a long description. ", 200), Effect: agent.Read,
		Handler: func(context.Context, agent.Invocation) (string, error) { return "", nil },
	}))
	_, err := run(context.Background(), a, turnOf("hi"), newExecutor(reg))
	require.ErrorIs(t, err, agent.ErrContextBudget)
	require.True(t, agent.IsTerminal(err))
	require.Regexp(t, `^the turn does not fit BATON_MODEL_CONTEXT_TOKENS \(--model-context-tokens\) of 1100 tokens even with its tool results left out and its messages cut \(the system prompt and the tool declarations take [0-9]+\): raise it, or shorten the system prompt \(BATON_SYSTEM_PROMPT, --system-prompt\)$`, err.Error())
	require.Equal(t, userTooLong, userText(t, err))
	require.Zero(t, srv.Count())
}
