package consumer

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// askingAgent asks a person how many tickets to open before it answers,
// and fails once, as a model call that may pass does, on the first step
// after the answer when failAfter is set.
type askingAgent struct {
	failAfter bool

	mu      sync.Mutex
	asked   map[int]int
	answers []string
}

func (a *askingAgent) Step(ctx context.Context, req StepRequest) (Step, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked[req.Index]++
	if req.Index == 0 {
		return Step{Text: "Let me ask.", Questions: []Question{{
			ID: "q1", Reason: "input", Message: "How many tickets?",
			ResponseSchema: json.RawMessage(`{"type":"object","properties":{"count":{"type":"integer","minimum":1}},"required":["count"]}`),
		}}}, nil
	}
	q := req.Steps[0].Questions[0]
	a.answers = append(a.answers, q.Status+" "+string(q.Answer))
	if a.failAfter && a.asked[1] == 1 {
		return Step{}, errModelBlip
	}
	if q.Status != schema.ApprovalApproved {
		return Step{Text: "Nothing then."}, nil
	}
	return Step{Text: "Opening " + string(q.Answer) + "."}, nil
}

// answer decides the conversation's pending approval with d, as the API
// does.
func (b *bundle) answer(t *testing.T, conversation string, approvalID string, d schema.Decision) (schema.Approval, error) {
	t.Helper()
	var a schema.Approval
	err := pgx.BeginFunc(context.Background(), b.DB.Pool, func(tx pgx.Tx) error {
		var err error
		a, err = schema.DecideApprovalTx(context.Background(), tx, b.Owner, conversation, approvalID, d)
		return err
	})
	return a, err
}

// TestAnAgentsQuestionWaitsForAPersonAndItsAnswerGoesBackWithTheNextStep:
// the step that asks is journaled and the turn waits, holding nothing; an
// answer the agent's schema refuses changes nothing; the answer it takes
// resumes the turn with the next step, which carries it. A re-claim after
// the answer (a failed attempt) finds the answer in the journal: the agent
// is never asked the question again.
func TestAnAgentsQuestionWaitsForAPersonAndItsAnswerGoesBackWithTheNextStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := &askingAgent{asked: map[int]int{}, failAfter: true}
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.OnConversationEvent = agent, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "open tickets")
	evs.wait(t, 20*time.Second, key, batonnats.EventWaitingForApproval)
	require.Zero(t, b.Count(`SELECT count(*) FROM conversations WHERE run_id IS NOT NULL`), "nothing holds the conversation while it waits")

	as, err := schema.ListApprovals(context.Background(), b.DB.Pool, b.Owner, "c", 10)
	require.NoError(t, err)
	require.Len(t, as, 1)
	require.Equal(t, schema.ApprovalKindQuestion, as[0].Kind)
	require.Equal(t, "How many tickets?", as[0].Question.Message)
	waiting := as[0].ID

	_, err = b.answer(t, "c", waiting, schema.Decision{Approved: true, Answer: json.RawMessage(`{"count":0}`)})
	require.ErrorIs(t, err, schema.ErrAnswerInvalid, "an answer the schema refuses")
	_, err = b.answer(t, "c", waiting, schema.Decision{Approved: true})
	require.ErrorIs(t, err, schema.ErrAnswerInvalid, "a question that expects an answer gets one")
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM approvals WHERE status = 'pending'`), "a refused answer changes nothing")

	_, err = b.answer(t, "c", waiting, schema.Decision{Approved: true, Answer: json.RawMessage(`{"count":2}`)})
	require.NoError(t, err)
	evs.wait(t, 30*time.Second, key, batonnats.EventReplied)

	var content string
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(), `SELECT content FROM messages WHERE role = 'assistant'`).Scan(&content))
	require.Equal(t, "Let me ask.\n\nOpening {\"count\": 2}.", content)
	agent.mu.Lock()
	defer agent.mu.Unlock()
	require.Equal(t, 1, agent.asked[0], "the question is asked once, whatever the attempts")
	require.Equal(t, []string{`approved {"count": 2}`, `approved {"count": 2}`}, agent.answers, "the answer goes back with the next step, also after a re-claim")
}

// TestADeclinedQuestionGoesBackAsDenied: a person who says no to a
// question declines it, and the agent is told so.
func TestADeclinedQuestionGoesBackAsDenied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := &askingAgent{asked: map[int]int{}}
	var evs events
	cfg := b.testConfig()
	cfg.Agent, cfg.OnConversationEvent = agent, evs.record
	b.startWorker(cfg)
	key := b.Conversation("c")
	b.Send("c", "m1", "open tickets")
	evs.wait(t, 20*time.Second, key, batonnats.EventWaitingForApproval)
	as, err := schema.ListApprovals(context.Background(), b.DB.Pool, b.Owner, "c", 10)
	require.NoError(t, err)
	a, err := b.answer(t, "c", as[0].ID, schema.Decision{Approved: false})
	require.NoError(t, err)
	require.Equal(t, schema.ApprovalDenied, a.Status)
	evs.wait(t, 30*time.Second, key, batonnats.EventReplied)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM messages WHERE role = 'assistant' AND content = E'Let me ask.\n\nNothing then.'`))
}
