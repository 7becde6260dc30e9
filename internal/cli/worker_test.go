package cli_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// TestWorkerWithOnlyALeaseUsesItAsTheAckWait: a flag left out means the
// library's default, and the ack wait's default is the lease, so
// `baton worker --lease 2m` starts and its durable waits 2m for acks.
func TestWorkerWithOnlyALeaseUsesItAsTheAckWait(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	_, js := n.Connect(t)
	// The relay owns the stream; a worker waits for it and reads it.
	_, _, err := batonnats.ProvisionStream(context.Background(), js, batonnats.StreamConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	stop := start(t, "worker", "--lease", "2m", "--database-url", db.URL, "--nats-url", n.URL)

	var info *jetstream.ConsumerInfo
	deadline := time.Now().Add(30 * time.Second)
	for info == nil {
		if c, err := js.Consumer(context.Background(), batonnats.DefaultStream, batonnats.DefaultConsumer); err == nil {
			info = c.CachedInfo()
			break
		}
		require.True(t, time.Now().Before(deadline), "the worker did not create its durable within 30s")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 2*time.Minute, info.Config.AckWait, "the ack wait defaults to the lease")
	code, stderr := stop()
	require.Equal(t, 0, code, stderr)
}

// TestSettingErrorsNameTheFlagAndTheVariable: a value a library refuses is
// reported with the flag and the variable that set it, and the value.
func TestSettingErrorsNameTheFlagAndTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--lease", "50ms"}, "--lease / BATON_LEASE 50ms: too short"},
		{[]string{"worker", "--lease", "30s", "--ack-wait", "5s"}, "--ack-wait / BATON_ACK_WAIT 5s: must exceed a third of the lease 30s"},
		{[]string{"worker", "--max-attempts=-1"}, "--max-attempts / BATON_MAX_ATTEMPTS -1: must be at least 1"},
		{[]string{"worker", "--replicas", "7"}, "--replicas / BATON_REPLICAS 7: out of range"},
		{[]string{"worker", "--agent", "openai"}, `--model / BATON_MODEL "": give a model the server knows`},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--max-model-calls=-1"}, "--max-model-calls / BATON_MAX_MODEL_CALLS -1"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--max-tool-iterations=-1"}, "--max-tool-iterations / BATON_MAX_TOOL_ITERATIONS -1"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-timeout=-1s"}, "--model-timeout / BATON_MODEL_TIMEOUT -1s"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-first-byte-timeout=-1s"}, "--model-first-byte-timeout / BATON_MODEL_FIRST_BYTE_TIMEOUT -1s: negative"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-idle-timeout=-1s"}, "--model-idle-timeout / BATON_MODEL_IDLE_TIMEOUT -1s: negative"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-context-tokens=500"}, "--model-context-tokens / BATON_MODEL_CONTEXT_TOKENS 500: too small"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-max-tool-result-bytes=10"}, "--model-max-tool-result-bytes / BATON_MODEL_MAX_TOOL_RESULT_BYTES 10: too small"},
		{[]string{"worker", "--agent", "openai", "--model", "m", "--model-base-url", "localhost:8000"}, "--model-base-url / BATON_MODEL_BASE_URL"},
		{[]string{"worker", "--agent", "a2a"}, "--agent a2a needs --agent-url (BATON_AGENT_URL)"},
		{[]string{"worker", "--agent", "a2a", "--agent-url", "http://127.0.0.1:1/a2a"}, "--agent a2a needs --agent-signing-key (BATON_AGENT_SIGNING_KEY)"},
		{[]string{"worker", "--agent", "a2a", "--mcp-server", "x=http://127.0.0.1:1/mcp"}, "an A2A agent runs its own tools, and Baton declares it none"},
		{[]string{"relay", "--sweep-interval", "2m", "--sweep-age", "1m"}, "--sweep-age / BATON_RELAY_SWEEP_AGE 1m0s: must be at least the sweep interval"},
		{[]string{"relay", "--slot", "Bad-Name"}, "--slot / BATON_SLOT"},
		{[]string{"group", "run", "audit", "--lanes=-2"}, "--lanes / BATON_GROUP_LANES -2"},
		{[]string{"group", "run", "audit", "--retry-min", "2s", "--retry-max", "1s"}, "--retry-max / BATON_GROUP_RETRY_MAX 1s"},
	} {
		_, stderr, code := run(t, append(tc.args, "--database-url", "postgres://127.0.0.1:1/none")...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}
