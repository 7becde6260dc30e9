// Package oidctest gives tests the issuers of JSON Web Tokens that Baton
// verifies: a real OpenID Connect provider (the oidc-provider package, run
// by Node as a child process, reached over plain HTTP), a key server whose
// JWKS a test controls (down, oversized, rotated), and tokens signed with
// an HS256 secret, as an application's backend mints them.
package oidctest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/proctest"
)

// Client of the provider: the application's backend, which gets tokens
// with the client credentials grant; a token's sub is ClientID.
const (
	ClientID     = "baton-test-app"
	clientSecret = "baton-test-secret"
)

// Provider is a running oidc-provider. Each start signs with a new key.
type Provider struct {
	// Issuer is its issuer, http://127.0.0.1:<port>, as its tokens'
	// iss say.
	Issuer string
	// KeyID is the kid of the key it signs with now.
	KeyID string

	t    testing.TB
	port int
	proc *proctest.Process
}

// providerDir is the folder of the provider's script and node_modules.
func providerDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "provider")
}

// StartProvider starts oidc-provider on a free port of 127.0.0.1. It
// stops when t ends.
func StartProvider(t testing.TB) *Provider {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed: run `make test-deps`, which installs Debian's nodejs and the provider's packages")
	}
	if _, err := os.Stat(filepath.Join(providerDir(), "node_modules", "oidc-provider")); err != nil {
		t.Fatalf("the OpenID Connect provider's packages are missing from %s/node_modules: run `make test-deps` (npm ci there)", providerDir())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	p := &Provider{t: t, port: port, Issuer: "http://127.0.0.1:" + strconv.Itoa(port)}
	p.start()
	t.Cleanup(p.Stop)
	return p
}

func (p *Provider) start() {
	p.t.Helper()
	cmd := exec.Command("node", "provider.mjs")
	cmd.Dir = providerDir()
	cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(p.port), "CLIENT_ID="+ClientID, "CLIENT_SECRET="+clientSecret)
	proc, err := proctest.Start("oidc-provider", cmd, proctest.Options{})
	require.NoError(p.t, err)
	p.proc = proc
	line, err := proc.AwaitLine(nil, 30*time.Second, "ready ")
	require.NoError(p.t, err, "oidc-provider did not start:\n%s", proc.Tail(20))
	fields := strings.Fields(line)
	require.Len(p.t, fields, 3, "the provider's ready line: %q", line)
	require.Equal(p.t, p.Issuer, fields[1])
	p.KeyID = fields[2]
}

// Stop stops the provider: its discovery document and JWKS are gone.
func (p *Provider) Stop() {
	if p.proc != nil {
		p.proc.Stop(5 * time.Second)
		p.proc = nil
	}
}

// Restart stops the provider and starts it again on the same port with a
// new signing key: a key rotation that withdraws the old key.
func (p *Provider) Restart() {
	p.t.Helper()
	old := p.KeyID
	p.Stop()
	p.start()
	require.NotEqual(p.t, old, p.KeyID, "a restarted provider signs with a new key")
}

// Token gets an access token for resource through the provider's token
// endpoint (client credentials grant, resource indicator): a JWT whose
// aud is resource and whose sub is ClientID.
func (p *Provider) Token(t testing.TB, resource string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "resource": {resource}, "scope": {"chat"}}
	req, err := http.NewRequest(http.MethodPost, p.Issuer+"/token", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(ClientID, clientSecret)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "the provider's token endpoint: %s", body)
	var out struct {
		AccessToken string `json:"access_token"`
	}
	require.NoError(t, json.Unmarshal(body, &out))
	require.Equal(t, 2, strings.Count(out.AccessToken, "."), "the provider should issue a JWT access token, not %q", out.AccessToken)
	return out.AccessToken
}

// PublicKeys returns the provider's JWKS as it publishes it.
func (p *Provider) PublicKeys(t testing.TB) jose.JSONWebKeySet {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(p.Issuer + "/jwks")
	require.NoError(t, err)
	defer resp.Body.Close()
	var set jose.JSONWebKeySet
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&set))
	require.NotEmpty(t, set.Keys, "the provider publishes its key")
	return set
}

// String names the provider in messages.
func (p *Provider) String() string { return fmt.Sprintf("oidc-provider at %s", p.Issuer) }
