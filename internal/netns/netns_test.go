package netns_test

import (
	"bufio"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/netns"
	"github.com/batonhq/baton/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// echoServer answers every line on the host's address until the test
// ends.
func echoServer(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line on c and returns how long its echo took.
func roundTrip(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	began := time.Now()
	_, err := c.Write([]byte("ping\n"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	return time.Since(began)
}

// TestADelayedLinkHoldsEveryPacketBothWays: a connection from a node's
// namespace, made before the link is delayed, takes at least twice the
// delay per round trip while it is (each packet is held both ways, on
// connections that exist already, not only new ones), a new connection's
// handshake too, and none once the delay is stopped.
func TestADelayedLinkHoldsEveryPacketBothWays(t *testing.T) {
	t.Parallel()
	nw, err := netns.New()
	require.NoError(t, err, "this test makes a network namespace and delays its link")
	t.Cleanup(nw.Close)
	node, err := nw.Add("client")
	require.NoError(t, err)
	addr := echoServer(t, nw.HostIP())
	dial := func() net.Conn {
		var c net.Conn
		require.NoError(t, node.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", addr, 10*time.Second)
			return err
		}))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const delay = 300 * time.Millisecond
	before := dial()
	roundTrip(t, before)

	d, err := node.Delay(delay)
	require.NoError(t, err)
	require.GreaterOrEqual(t, roundTrip(t, before), 2*delay, "a round trip on an existing connection is delayed both ways")
	began := time.Now()
	during := dial()
	require.GreaterOrEqual(t, time.Since(began), 2*delay, "a new connection's handshake is delayed both ways")
	require.GreaterOrEqual(t, roundTrip(t, during), 2*delay, "a round trip on a new connection is delayed both ways")

	require.NoError(t, d.Stop())
	require.Less(t, roundTrip(t, before), 2*delay, "once stopped, nothing is held")
}
