package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTrackerConfirmsOnlyFullyAcknowledgedPrefixes(t *testing.T) {
	t.Parallel()
	tr := newTracker(100)
	a := tr.begin(time.Now())
	tr.add(a)
	tr.add(a)
	tr.commit(a, 200)
	b := tr.begin(time.Now())
	tr.add(b)
	tr.commit(b, 300)
	heartbeat := tr.begin(time.Time{})
	tr.commit(heartbeat, 350)
	require.Equal(t, 3, tr.InFlight())

	// b is acknowledged first: a still holds the position back.
	tr.acked(b)
	require.EqualValues(t, 100, tr.Confirmed(), "a transaction acked before an older one is not confirmed")
	tr.acked(a)
	require.EqualValues(t, 100, tr.Confirmed(), "a transaction with an event in flight is not confirmed")
	tr.acked(a)
	require.EqualValues(t, 350, tr.Confirmed(), "once everything before it is acked, the heartbeat's position is confirmed")
	require.Zero(t, tr.InFlight())

	// An open transaction (commit not decoded yet) is never confirmed,
	// even with all its events acked.
	c := tr.begin(time.Now())
	tr.add(c)
	tr.acked(c)
	require.EqualValues(t, 350, tr.Confirmed())
	tr.commit(c, 400)
	require.EqualValues(t, 400, tr.Confirmed())
}

func TestTrackerNeverMovesBackwards(t *testing.T) {
	t.Parallel()
	tr := newTracker(500)
	x := tr.begin(time.Now())
	tr.commit(x, 300) // resent from before the slot's position
	require.EqualValues(t, 500, tr.Confirmed())
}
