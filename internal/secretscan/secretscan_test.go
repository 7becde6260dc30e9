package secretscan

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryFormIsFound: a secret is found however a line writes it, so a
// leak cannot hide behind an encoding, and the mask hides every form.
func TestEveryFormIsFound(t *testing.T) {
	s := Secret{Name: "password", Value: `p@ss/w:rd?&"x`}
	for _, line := range []string{
		`connect to nats://u:p@ss/w:rd?&"x@host:4222`,
		`{"url":"postgres://u:p%40ss%2Fw%3Ard%3F&%22x@host/db"}`,
		`{"url":"postgres://u:p%40ss%2Fw%3Ard%3F%26%22x@host/db"}`,
		`{"error":"password p@ss/w:rd?\u0026\"x refused"}`,
		`{"error":"password p@ss/w:rd?&\"x refused"}`,
		`{"query":"password=p%40ss%2Fw%3Ard%3F%26%22x"}`,
	} {
		require.NotEmpty(t, s.In(line), "the search should find the secret in %s", line)
		masked := s.Mask(line)
		require.Empty(t, s.In(masked), "the mask should hide it in %s", line)
		require.Contains(t, masked, "<password>")
	}
	require.Empty(t, s.In(`{"url":"nats://redacted@host:4222"}`))
	require.Empty(t, Secret{Name: "short", Value: "abc"}.In("abc abc"), "forms shorter than MinForm are not searched")
}
