package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
)

func freePort(t *testing.T) int {
	p, err := pgcluster.FreePort()
	require.NoError(t, err)
	return p
}

// startDev runs `baton dev` until the returned stop is called, and waits
// until it answers.
func startDev(t *testing.T, dir string, httpPort, pgPort, natsPort int) (base string, stdout *testenv.SyncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &testenv.SyncBuffer{}, &testenv.SyncBuffer{}
	done := make(chan error, 1)
	base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	go func() {
		done <- cli.Run(ctx, []string{"--log-format", "json", "dev", "--dir", dir,
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort),
			"--pg-port", fmt.Sprint(pgPort), "--nats-port", fmt.Sprint(natsPort)}, stdout, stderr)
	}()
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(stdout.String(), "Baton is running") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("baton dev ended early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("baton dev not ready within 90s:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				err = fmt.Errorf("baton dev did not stop within 60s:\n%s", stderr.String())
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return base, stdout, stop
}

func call(t *testing.T, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func TestDevRunsTheWholePathStopsCleanlyAndKeepsDataAcrossARestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	// The cluster runs as the postgres user when the tests run as root: let
	// it reach the folder.
	for p := filepath.Dir(dir); p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o755)
	}
	httpPort, pgPort, natsPort := freePort(t), freePort(t), freePort(t)
	base, stdout, stop := startDev(t, dir, httpPort, pgPort, natsPort)
	tokenBytes, err := os.ReadFile(filepath.Join(dir, "dev-token"))
	require.NoError(t, err)
	token := strings.TrimSpace(string(tokenBytes))
	require.Contains(t, stdout.String(), base+"/#token="+token, "the printed link carries the token")
	agentKey := requireDevAgentKey(t, dir, base)
	require.Contains(t, stdout.String(), "agent key: "+agentKey, "baton dev prints the agent key's id")
	requireNoKey(t, privateKeySecrets(t, filepath.Join(dir, "agent-signing-key.pem")), stdout.String())

	code, _ := call(t, "POST", base+"/v1/conversations", token, `{"id":"dev"}`)
	require.Equal(t, http.StatusCreated, code)
	code, _ = call(t, "POST", base+"/v1/conversations/dev/messages", token, `{"id":"m1","content":"hello dev"}`)
	require.Equal(t, http.StatusAccepted, code)
	waitReply := func(base string) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, body := call(t, "GET", base+"/v1/conversations/dev/messages", token, "")
			if msgs, _ := body["messages"].([]any); len(msgs) == 2 && msgs[1].(map[string]any)["content"] == "echo: hello dev" {
				return
			}
			require.True(t, time.Now().Before(deadline), "no echo reply within 30s: %v", body)
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitReply(base)

	require.NoError(t, stop(), "Ctrl-C stops every part cleanly")
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", pgPort), time.Second)
	if err == nil {
		conn.Close()
		t.Fatal("the local PostgreSQL still accepts connections after baton dev stopped")
	}

	// Started again: same token, same data, same agent key.
	base, _, stop = startDev(t, dir, httpPort, pgPort, natsPort)
	waitReply(base)
	require.Equal(t, agentKey, requireDevAgentKey(t, dir, base), "the agent key is kept across a restart")
	require.NoError(t, stop())
}

// requireDevAgentKey checks that baton dev keeps its agent key pair under
// dir, the private key its owner's only, and serves the public key at
// /.well-known/jwks.json; it returns the key id.
func requireDevAgentKey(t *testing.T, dir, base string) string {
	t.Helper()
	priv := filepath.Join(dir, "agent-signing-key.pem")
	fi, err := os.Stat(priv)
	require.NoError(t, err, "baton dev makes an agent signing key")
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	key, err := jwtauth.LoadSigningKey(priv)
	require.NoError(t, err)
	keys, err := jwtauth.LoadPublicKeys(filepath.Join(dir, "agent-public-key.pem"))
	require.NoError(t, err)
	require.Equal(t, []string{key.KeyID()}, keys.KeyIDs(), "the public key file is the private key's")
	resp, err := http.Get(base + "/.well-known/jwks.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	var jwks struct {
		Keys []struct{ Kid string } `json:"keys"`
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&jwks))
	require.Len(t, jwks.Keys, 1)
	require.Equal(t, key.KeyID(), jwks.Keys[0].Kid)
	return key.KeyID()
}

func TestDevOnABusyPortNamesTheFlag(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	_, stderr, code := run(t, "dev", "--dir", t.TempDir(), "--http-addr", l.Addr().String())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--http-addr")
}
