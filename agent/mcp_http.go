package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

type idempotencyKeyContext struct{}

// withIdempotencyKey gives the HTTP requests of one call their
// Idempotency-Key header (the SDK makes them with the call's context).
func withIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKeyContext{}, key)
}

// errResponseTooLarge: an answer over MCPMaxResponseBytes is not read.
var errResponseTooLarge = fmt.Errorf("the answer is larger than %d bytes, the most Baton reads", MCPMaxResponseBytes)

// errPrivateAddress: a request to a private address is refused unless
// AllowPrivate.
var errPrivateAddress = errors.New("refused to connect to a private, loopback or link-local address (set --mcp-allow-private to allow it)")

// newMCPHTTPClient is the client of one HTTP server: it sends the bearer
// token to that server's host only (never to where a redirect leads), the
// call's idempotency key as Idempotency-Key, reads at most
// MCPMaxResponseBytes of an answer, and connects to no private, loopback
// or link-local address unless allowPrivate: the check is made on the
// address dialled, after name resolution, so neither a redirect nor a
// name that resolves to such an address gets through.
func newMCPHTTPClient(endpoint, token string, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = func(network, address string, _ syscall.RawConn) error {
			return checkPublicAddress(address)
		}
	}
	base := &http.Transport{
		// No proxy from the environment: where a request goes is the
		// configured URL's business alone.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	host := ""
	if u, err := url.Parse(endpoint); err == nil {
		host = u.Host
	}
	return &http.Client{
		Transport: &mcpTransport{base: base, host: host, token: token},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("stopped after 5 redirects")
			}
			return nil
		},
	}
}

// checkPublicAddress refuses a dial to an address that is not public.
func checkPublicAddress(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("refused to connect to %q: not an IP address", host)
	}
	if !publicAddress(ip) {
		return fmt.Errorf("%w: %s", errPrivateAddress, ip)
	}
	return nil
}

// notGlobal are the ranges of IANA's special-purpose address registries
// that are not globally reachable and that netip's predicates leave out:
// shared address space (carrier-grade NAT), IETF protocol assignments,
// documentation, benchmarking (which networks inside a company use), the
// reserved 240/4, NAT64 for local use and the discard prefix. An address
// in them is private in all but name.
var notGlobal = []netip.Prefix{
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:2::/48"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("3fff::/20"),
}

// publicAddress reports whether ip is an address on the public internet.
func publicAddress(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsUnspecified() ||
		ip.IsMulticast() || (ip.Is4() && ip.As4()[0] == 0) {
		return false
	}
	for _, p := range notGlobal {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

type mcpTransport struct {
	base  http.RoundTripper
	host  string
	token string
}

func (t *mcpTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		// Go's transport sends a request with an Idempotency-Key again
		// by itself when its connection broke, if it can rewind the body:
		// a call whose outcome is unknown must never be sent again.
		req.GetBody = nil
	}
	if t.token != "" && req.URL.Host == t.host {
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	if key, ok := req.Context().Value(idempotencyKeyContext{}).(string); ok && key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	res.Body = &limitedBody{ReadCloser: res.Body, left: MCPMaxResponseBytes}
	return res, nil
}

// limitedBody fails a read past its limit instead of reading on.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errResponseTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
