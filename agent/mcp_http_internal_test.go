package agent

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOnlyPublicAddressesArePublic(t *testing.T) {
	t.Parallel()
	for _, a := range []string{"127.0.0.1", "127.0.0.2", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"fe80::1", "fc00::1", "100.64.0.1", "0.0.0.0", "0.1.2.3", "::", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1",
		"198.18.0.1", "198.19.255.254", "::ffff:198.18.3.1", "192.0.2.1", "198.51.100.7", "203.0.113.9", "192.0.0.8",
		"240.0.0.1", "255.255.255.255", "2001:db8::1", "64:ff9b:1::a00:1", "100::1", "2001:2::1", "3fff::1"} {
		require.False(t, publicAddress(netip.MustParseAddr(a)), "%s must count as private", a)
	}
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "198.17.255.255", "198.20.0.1", "64:ff9b::808:808"} {
		require.True(t, publicAddress(netip.MustParseAddr(a)), "%s is public", a)
	}
}

func TestAnMCPRequestToALoopbackAddressIsRefusedBeforeItLeavesUnlessAllowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)

	_, err := newMCPHTTPClient(srv.URL, "", false).Post(srv.URL+"/mcp", "application/json", strings.NewReader("{}"))
	require.Error(t, err)
	require.True(t, errors.Is(err, errPrivateAddress), "the refusal says why and how to allow it: %v", err)
	require.Zero(t, hits.Load(), "nothing reached the server")

	res, err := newMCPHTTPClient(srv.URL, "", true).Post(srv.URL+"/mcp", "application/json", strings.NewReader("{}"))
	require.NoError(t, err, "--mcp-allow-private lets it through")
	_ = res.Body.Close()
	require.EqualValues(t, 1, hits.Load())
}

func TestARedirectGetsNeitherThePrivateAddressNorTheBearerToken(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Value
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Store(r.Header.Get("Authorization") + "|")
	}))
	t.Cleanup(other.Close)
	var own atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		own.Store(r.Header.Get("Authorization"))
		http.Redirect(w, r, other.URL+"/elsewhere", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)

	// Allowed to reach loopback (the test's only addresses), the token
	// still goes to the configured host alone.
	res, err := newMCPHTTPClient(srv.URL, "s3cret-token", true).Get(srv.URL + "/mcp")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	require.Equal(t, "Bearer s3cret-token", own.Load(), "the configured server gets its token")
	require.Equal(t, "|", elsewhere.Load(), "the redirect's target gets no token")
}
