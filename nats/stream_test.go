package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

// TestTheOwnerProvisionsTheStreamAndRefusesToShrinkItUnlessTold: the
// relay creates the stream, records its partitions, changes a setting and
// says what it changed, and refuses to cut max age or replicas without
// AllowShrink, leaving the stream as it was.
func TestTheOwnerProvisionsTheStreamAndRefusesToShrinkItUnlessTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testenv.StartNATS(t).Connect(t)
	c := batonnats.StreamConfig{Name: "OWNED", SubjectPrefix: "owned.x", MaxAge: 720 * time.Hour, Partitions: 8}
	_, changes, err := batonnats.ProvisionStream(ctx, js, c, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	require.Empty(t, changes, "a new stream changes nothing")

	_, changes, err = batonnats.ProvisionStream(ctx, js, c, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	require.Empty(t, changes, "the same settings again change nothing")

	longer := c
	longer.DuplicateWindow = 5 * time.Minute
	_, changes, err = batonnats.ProvisionStream(ctx, js, longer, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	require.Equal(t, []batonnats.StreamChange{{Setting: "duplicate window", Old: "2m0s", New: "5m0s"}}, changes)

	before, err := js.Stream(ctx, "OWNED")
	require.NoError(t, err)
	shorter := longer
	shorter.MaxAge = 168 * time.Hour
	_, _, err = batonnats.ProvisionStream(ctx, js, shorter, batonnats.ProvisionOptions{})
	var shrink *batonnats.ShrinkError
	require.True(t, errors.As(err, &shrink), "%v", err)
	require.Equal(t, "max age", shrink.Setting)
	require.Contains(t, err.Error(), "from 720h0m0s to 168h0m0s")
	after, err := js.Stream(ctx, "OWNED")
	require.NoError(t, err)
	require.Equal(t, before.CachedInfo().Config, after.CachedInfo().Config, "a refused shrink leaves the stream alone")

	_, changes, err = batonnats.ProvisionStream(ctx, js, shorter, batonnats.ProvisionOptions{AllowShrink: true})
	require.NoError(t, err)
	require.Equal(t, []batonnats.StreamChange{{Setting: "max age", Old: "720h0m0s", New: "168h0m0s"}}, changes)
}

// TestJoinStreamReadsTheStreamAndRefusesADisagreement: every process but
// the owner takes the stream's settings, and a setting given explicitly
// that disagrees is an error naming the field and both values.
func TestJoinStreamReadsTheStreamAndRefusesADisagreement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testenv.StartNATS(t).Connect(t)
	owned := batonnats.StreamConfig{Name: "DRIFT", SubjectPrefix: "drift.x", MaxAge: 720 * time.Hour, Partitions: 8, DuplicateWindow: 5 * time.Minute}
	_, _, err := batonnats.ProvisionStream(ctx, js, owned, batonnats.ProvisionOptions{})
	require.NoError(t, err)

	got, err := batonnats.JoinStream(ctx, js, batonnats.StreamConfig{Name: "DRIFT"})
	require.NoError(t, err)
	require.Equal(t, owned.WithDefaults(), got, "a process given only the name takes every setting from the stream")

	for _, tc := range []struct {
		given batonnats.StreamConfig
		field string
	}{
		{batonnats.StreamConfig{Name: "DRIFT", SubjectPrefix: "baton.outbox"}, "SubjectPrefix"},
		{batonnats.StreamConfig{Name: "DRIFT", MaxAge: 168 * time.Hour}, "MaxAge"},
		{batonnats.StreamConfig{Name: "DRIFT", Replicas: 3}, "Replicas"},
		{batonnats.StreamConfig{Name: "DRIFT", DuplicateWindow: time.Minute}, "DuplicateWindow"},
		{batonnats.StreamConfig{Name: "DRIFT", Partitions: 16}, "Partitions"},
	} {
		_, err := batonnats.JoinStream(ctx, js, tc.given)
		var se *setting.Error
		require.True(t, errors.As(err, &se), "%+v: %v", tc.given, err)
		require.Equal(t, tc.field, se.Field)
		require.Contains(t, se.Problem, "the stream DRIFT has")
	}
	_, err = batonnats.JoinStream(ctx, js, batonnats.StreamConfig{Name: "MISSING"})
	require.ErrorIs(t, err, batonnats.ErrStreamMissing)
}
