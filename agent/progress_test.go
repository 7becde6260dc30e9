package agent_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
)

// The durations are the scaled down by ten: a token every 100ms
// for 3s with a 1s idle timeout (for a token every second for 30s with
// a 10s one).
const (
	tokenEvery  = 100 * time.Millisecond
	tokens      = 30
	idleTimeout = time.Second
)

// TestAStreamThatKeepsProducingIsNeverCutForBeingLong: a stream that sends
// a token every 100ms for 3s, three times its first-byte and idle
// timeouts, succeeds with one call.
func TestAStreamThatKeepsProducingIsNeverCutForBeingLong(t *testing.T) {
	t.Parallel()
	content := strings.Repeat("x", tokens)
	srv := agenttest.NewServer(t, agenttest.Response{Content: content, ChunkSize: 1, ChunkDelay: tokenEvery})
	a := newAgent(t, srv, func(c *agent.Config) {
		c.FirstByteTimeout = idleTimeout
		c.IdleTimeout = idleTimeout
		c.RequestTimeout = time.Minute
	})
	start := time.Now()
	reply, err := run(context.Background(), a, turnOf("write slowly"), newExecutor(agent.NewRegistry()))
	require.NoError(t, err)
	require.Equal(t, consumer.Reply{Content: content}, reply)
	require.Len(t, srv.Requests(), 1, "one call: a stream in progress is never paid for twice")
	require.Greater(t, time.Since(start), 3*idleTimeout/2, "the stream outlived its timeouts")
}

// TestTheOverallCapStillEndsACallThatNeverFinishes: the same stream
// against a cap shorter than it fails with the cap's message.
func TestTheOverallCapStillEndsACallThatNeverFinishes(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewServer(t, agenttest.Response{Content: strings.Repeat("x", tokens), ChunkSize: 1, ChunkDelay: tokenEvery})
	a := newAgent(t, srv, func(c *agent.Config) {
		c.IdleTimeout = idleTimeout
		c.RequestTimeout = time.Second
	})
	_, err := run(context.Background(), a, turnOf("write slowly"), newExecutor(agent.NewRegistry()))
	require.ErrorIs(t, err, agent.ErrModelTimeout)
	require.False(t, agent.IsTerminal(err))
	require.Equal(t, "the model call was still running after 1s, the longest a call may take (BATON_MODEL_TIMEOUT, --model-timeout): raise it for very long answers", err.Error())
	require.Equal(t, userTimeout, userText(t, err))
	require.Len(t, srv.Requests(), 1)
}

// TestAStreamThatStallsFailsAfterTheIdleTimeout: three chunks, then
// nothing: the call fails once the idle timeout has passed, and the
// attempt ends without a second call.
func TestAStreamThatStallsFailsAfterTheIdleTimeout(t *testing.T) {
	t.Parallel()
	idle := 300 * time.Millisecond
	srv := agenttest.NewServer(t, agenttest.Response{Content: "Hello there, world", StallAfter: 3})
	a := newAgent(t, srv, func(c *agent.Config) { c.IdleTimeout = idle })
	start := time.Now()
	_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	took := time.Since(start)
	require.ErrorIs(t, err, agent.ErrModelTimeout)
	require.False(t, agent.IsTerminal(err), "a stall may pass: the turn runner tries another attempt")
	require.Regexp(t, "^"+regexp.QuoteMeta("the model's answer stalled: nothing arrived for 300ms, ")+`[0-9.]+m?s`+regexp.QuoteMeta(" into the call (BATON_MODEL_IDLE_TIMEOUT, --model-idle-timeout): check the model server's load at BATON_MODEL_BASE_URL")+"$", err.Error())
	require.Equal(t, userTimeout, userText(t, err))
	require.Len(t, srv.Requests(), 1)
	require.GreaterOrEqual(t, took, idle, "it failed before the idle timeout")
}

// TestAServerThatSendsNothingFailsAfterTheFirstByteTimeout, streamed or
// not.
func TestAServerThatSendsNothingFailsAfterTheFirstByteTimeout(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, streaming bool) {
		srv := agenttest.NewServer(t, agenttest.Response{Hang: true})
		a := newAgent(t, srv, func(c *agent.Config) {
			c.DisableStreaming = !streaming
			c.FirstByteTimeout = 200 * time.Millisecond
		})
		start := time.Now()
		_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
		require.ErrorIs(t, err, agent.ErrModelTimeout)
		require.False(t, agent.IsTerminal(err))
		require.Equal(t, "the model server sent nothing for 200ms after the request (BATON_MODEL_FIRST_BYTE_TIMEOUT, --model-first-byte-timeout): check its load at BATON_MODEL_BASE_URL, or raise the timeout for a model that is slow to start", err.Error())
		require.Len(t, srv.Requests(), 1, "a timeout ends the attempt: it is not retried inside it")
		require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	})
}

// TestTheTurnsOwnEndIsNotAModelFault: a turn stopped by the runner (lost
// lease, shutdown) returns the runner's cause, not a timeout.
func TestTheTurnsOwnEndIsNotAModelFault(t *testing.T) {
	t.Parallel()
	srv := agenttest.NewServer(t, agenttest.Response{Hang: true})
	a := newAgent(t, srv, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-srv.Arrived()
		cancel(consumer.ErrTurnTimeout)
	}()
	_, err := run(ctx, a, turnOf("hi"), newExecutor(agent.NewRegistry()))
	require.ErrorIs(t, err, consumer.ErrTurnTimeout)
	require.False(t, agent.IsTerminal(err))
}

// TestAtFullScaleAStreamIsJudgedByItsProgress is the two cases above at
// their real durations: a token every second for 30 s with a 10 s idle
// timeout succeeds with one call, and a stream that stalls for 15 s after
// its first tokens fails once the 10 s have passed, before the stall ends.
func TestAtFullScaleAStreamIsJudgedByItsProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 30 s")
	}
	t.Parallel()
	const idle = 10 * time.Second
	t.Run("a token every second for 30s", func(t *testing.T) {
		t.Parallel()
		content := strings.Repeat("x", 30)
		srv := agenttest.NewServer(t, agenttest.Response{Content: content, ChunkSize: 1, ChunkDelay: time.Second})
		a := newAgent(t, srv, func(c *agent.Config) {
			c.FirstByteTimeout = idle
			c.IdleTimeout = idle
			c.RequestTimeout = 10 * time.Minute
		})
		start := time.Now()
		reply, err := run(context.Background(), a, turnOf("write slowly"), newExecutor(agent.NewRegistry()))
		require.NoError(t, err)
		require.Equal(t, consumer.Reply{Content: content}, reply)
		require.Len(t, srv.Requests(), 1)
		require.Greater(t, time.Since(start), 29*time.Second)
	})
	t.Run("a stall of 15s", func(t *testing.T) {
		t.Parallel()
		srv := agenttest.NewServer(t, agenttest.Response{Content: "Hello there, world", ChunkDelay: 15 * time.Second, ChunkSize: 18})
		a := newAgent(t, srv, func(c *agent.Config) {
			c.FirstByteTimeout = idle
			c.IdleTimeout = idle
		})
		start := time.Now()
		_, err := run(context.Background(), a, turnOf("hi"), newExecutor(agent.NewRegistry()))
		took := time.Since(start)
		require.ErrorIs(t, err, agent.ErrModelTimeout)
		require.Len(t, srv.Requests(), 1)
		require.GreaterOrEqual(t, took, idle, "it failed before the idle timeout")
		require.Less(t, took, 15*time.Second, "it waited for the stall to end")
	})
}
