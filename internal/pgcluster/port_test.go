package pgcluster

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFreePortIsOutsideTheEphemeralRange: a port the kernel may hand to an
// outgoing connection could be taken between a server's stop and its
// restart; FreePort avoids them.
func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low <= fixedPortsFrom+1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", low)
	}
	for range 20 {
		port, err := FreePort()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, fixedPortsFrom)
		require.Less(t, port, low, "port %d is in the ephemeral range from %d", port, low)
		require.True(t, PortFree(port))
	}
}
