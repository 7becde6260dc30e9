package agent_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// TestARetryAfterOf45SecondsIsWaitedOutsideTheLease: the model server
// answers the first call of one conversation 429 with Retry-After: 45,
// longer than a turn may wait inside its lease. Through the real client
// and the real worker: the conversation shows that it waits for the
// model, another conversation is answered meanwhile, the next call of the
// first starts no sooner than 45 s after the refusal, and its turn then
// succeeds with two calls in all and no error message.
func TestARetryAfterOf45SecondsIsWaitedOutsideTheLease(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 45 s, as the model server asks")
	}
	t.Parallel()
	const wait = 45 * time.Second
	s := newStack(t)
	var mu sync.Mutex
	calls := map[string][]time.Time{}
	model := agenttest.NewResponder(t, func(_ int, req agenttest.Request) agenttest.Response {
		conv := "other"
		if strings.HasPrefix(req.LastUser(), "busy") {
			conv = "busy"
		}
		mu.Lock()
		defer mu.Unlock()
		calls[conv] = append(calls[conv], time.Now())
		if conv == "busy" && len(calls[conv]) == 1 {
			return agenttest.Response{
				Status: http.StatusTooManyRequests,
				Header: http.Header{"Retry-After": {"45"}},
				Body:   `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`,
			}
		}
		return agenttest.Response{Content: "answer to " + conv}
	})
	callsOf := func(conv string) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), calls[conv]...)
	}
	reg := agent.NewRegistry()
	a := newAgent(t, model, nil)
	s.startWorker(a, reg, func(c *consumer.Config) { c.MaxAttempts = 3 })

	s.send("busy", "m1", "busy: hello")
	waiting := s.await("busy", batonnats.EventWaiting, batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventWaiting, waiting.Type)
	require.NotNil(t, waiting.NotBefore)
	refused := callsOf("busy")
	require.Len(t, refused, 1)
	require.WithinDuration(t, refused[0].Add(wait), *waiting.NotBefore, 2*time.Second, "the wait is the server's Retry-After")
	c, err := schema.GetConversation(context.Background(), s.db.Pool, s.owner, "busy")
	require.NoError(t, err)
	require.Equal(t, schema.TurnWaiting, c.TurnState, "the conversation shows that it waits for the model")

	s.send("other", "o1", "hi")
	require.Equal(t, batonnats.EventReplied, s.await("other", batonnats.EventReplied, batonnats.EventFailed).Type)
	require.Less(t, time.Since(refused[0]), wait, "the other conversation was answered during the wait")
	require.Len(t, callsOf("busy"), 1, "the waiting conversation was not called meanwhile")

	replied := s.awaitWithin(wait+30*time.Second, "busy", batonnats.EventReplied, batonnats.EventFailed)
	require.Equal(t, batonnats.EventReplied, replied.Type)
	all := callsOf("busy")
	require.Len(t, all, 2, "two calls in all: the refused one and the answer")
	require.GreaterOrEqual(t, all[1].Sub(all[0]), wait, "the second call starts no sooner than the Retry-After")
	require.Equal(t, 1, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = 'busy' AND role = 'assistant'`))
	require.Zero(t, testenv.Count(t, s.db.Pool, `SELECT count(*) FROM messages WHERE conversation_id = 'busy' AND role = 'error'`), "a wait is not a failure the user sees")
	require.Equal(t, 2, testenv.Count(t, s.db.Pool, `SELECT attempts FROM agent_outbox WHERE conversation_id = 'busy'`), "the refused call was a real attempt, and the only retry")
}
