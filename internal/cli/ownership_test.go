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

// TestNonOwnersRefuseADisagreeingStreamSettingAndChangeNothing: the relay
// owns the outbox stream. A worker, a group, a replay or status started with a
// stream setting that disagrees with the stream exits with a usage error
// naming the setting and both values, and the stream is exactly as it
// was; started with none of them, a worker takes the stream's settings and
// consumes it.
func TestNonOwnersRefuseADisagreeingStreamSettingAndChangeNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	n := testenv.StartNATS(t)
	_, js := n.Connect(t)
	_, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{
		Name: "DRIFT", SubjectPrefix: "drift.x", MaxAge: 720 * time.Hour, Partitions: 8,
	}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	config := func() jetstream.StreamConfig {
		s, err := js.Stream(ctx, "DRIFT")
		require.NoError(t, err)
		return s.CachedInfo().Config
	}
	before := config()

	conn := []string{"--database-url", db.URL, "--nats-url", n.URL, "--stream", "DRIFT"}
	for _, cmd := range [][]string{{"worker"}, {"group", "run", "audit"}, {"replay", "--group", "audit", "--all", "--dry-run"}, {"status"}} {
		for _, tc := range []struct {
			flag []string
			want string
		}{
			{[]string{"--subject-prefix", "baton.outbox"}, "--subject-prefix / BATON_SUBJECT_PREFIX baton.outbox: the stream DRIFT has drift.x"},
			{[]string{"--max-age", "168h"}, "--max-age / BATON_MAX_AGE 168h0m0s: the stream DRIFT has 720h0m0s"},
			{[]string{"--replicas", "3"}, "--replicas / BATON_REPLICAS 3: the stream DRIFT has 1"},
			{[]string{"--duplicate-window", "1m"}, "--duplicate-window / BATON_DUPLICATE_WINDOW 1m0s: the stream DRIFT has 2m0s"},
		} {
			args := append(append(append([]string{}, cmd...), conn...), tc.flag...)
			_, stderr, code := run(t, args...)
			require.Equal(t, 2, code, "%v: %s", args, stderr)
			require.Contains(t, stderr, tc.want, "%v", args)
		}
	}
	require.Equal(t, before, config(), "no process but the owner changed the stream")

	// With no stream setting, a worker takes the stream's prefix and
	// partitions and consumes it.
	stop := start(t, append([]string{"worker"}, conn...)...)
	var ci *jetstream.ConsumerInfo
	deadline := time.Now().Add(30 * time.Second)
	for ci == nil {
		if c, err := js.Consumer(ctx, "DRIFT", batonnats.DefaultConsumer); err == nil {
			ci = c.CachedInfo()
			break
		}
		require.True(t, time.Now().Before(deadline), "the worker did not create its durable on DRIFT within 30s")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, "drift.x.>", ci.Config.FilterSubject, "the worker consumes the stream's subjects")
	code, stderr := stop()
	require.Equal(t, 0, code, stderr)
	require.Equal(t, before, config(), "a worker never changes the stream")
}
