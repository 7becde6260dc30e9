package agent_test

import (
	"context"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/testenv"
)

func TestExternalConfigNamesTheWrongSettingAndPrintsNoSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	const secretURL = "https://user:url-secret@agent.example.com/run?key=query-secret"
	ok := agent.ExternalConfig{Protocol: agent.ProtocolAGUI, URL: "http://127.0.0.1:1/agent"}
	cases := []struct {
		field  string
		change func(*agent.ExternalConfig)
	}{
		{"Protocol", func(c *agent.ExternalConfig) { c.Protocol = "a2a" }},
		{"URL", func(c *agent.ExternalConfig) { c.URL = "ftp://user:url-secret@agent.example.com/" }},
		{"URL", func(c *agent.ExternalConfig) { c.URL = "" }},
		{"MaxInFlight", func(c *agent.ExternalConfig) { c.MaxInFlight = -1 }},
		{"MaxStepBytes", func(c *agent.ExternalConfig) { c.MaxStepBytes = 10 }},
		{"MaxToolCalls", func(c *agent.ExternalConfig) { c.MaxToolCalls = -3 }},
		{"IdleTimeout", func(c *agent.ExternalConfig) { c.IdleTimeout = -time.Second }},
		{"ThreadID", func(c *agent.ExternalConfig) { c.ThreadID = "random" }},
		{"Headers[X-Api-Key]", func(c *agent.ExternalConfig) {
			c.URL = secretURL
			c.Headers = map[string]string{"X-Api-Key": "header-secret\n"}
		}},
		{"Headers[Idempotency-Key]", func(c *agent.ExternalConfig) { c.Headers = map[string]string{"Idempotency-Key": "header-secret"} }},
		{"Headers[Authorization]", func(c *agent.ExternalConfig) {
			c.Headers = map[string]string{"Authorization": "Bearer header-secret"}
			c.Authorizer = &authorizer{}
		}},
		{"Headers", func(c *agent.ExternalConfig) { c.Headers = map[string]string{"Bad Name": "header-secret"} }},
		{"TLSCAFile", func(c *agent.ExternalConfig) { c.TLSCAFile = notPEM }},
		{"TLSCAFile", func(c *agent.ExternalConfig) { c.TLSCAFile = filepath.Join(dir, "missing.pem") }},
		{"TLSCAFile", func(c *agent.ExternalConfig) {
			c.TLSCAFile = notPEM
			c.HTTPClient = http.DefaultClient
		}},
	}
	for _, c := range cases {
		cfg := ok
		c.change(&cfg)
		_, err := agent.NewExternal(cfg)
		var se *setting.Error
		require.True(t, errors.As(err, &se), "%s: want a *setting.Error, got %v", c.field, err)
		require.Equal(t, c.field, se.Field, err.Error())
		for _, secret := range []string{"url-secret", "query-secret", "header-secret"} {
			require.NotContains(t, err.Error(), secret, "%s: no secret in the error", c.field)
		}
	}
	x, err := agent.NewExternal(agent.ExternalConfig{Protocol: agent.ProtocolAISDK, URL: secretURL})
	require.NoError(t, err, "a URL with credentials is a URL")
	require.Equal(t, "https://agent.example.com", x.Audience(), "the audience is the origin, without credentials")
}

func TestAnHTTPSAgentIsTrustedThroughTLSCAFile(t *testing.T) {
	t.Parallel()
	frames := agenttest.AGUIRun(agenttest.AGUIText("a", "ok", 2))
	srv := agenttest.NewTLSAgent(t, agenttest.AgentReply{Frames: frames})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

	_, err := stepOnce(context.Background(), newExternal(t, agent.ProtocolAGUI, srv, func(c *agent.ExternalConfig) { c.MaxRetries = -1 }), turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentUnavailable, "without the CA the agent's certificate is not trusted")
	require.Contains(t, err.Error(), "BATON_AGENT_TLS_CA, --agent-tls-ca")

	st, err := stepOnce(context.Background(), newExternal(t, agent.ProtocolAGUI, srv, func(c *agent.ExternalConfig) { c.TLSCAFile = ca }), turnOf("q"), nil)
	require.NoError(t, err)
	require.Equal(t, "ok", st.Text)
}

// secretAuthorizer signs the same secret token for every request.
type secretAuthorizer struct{}

func (secretAuthorizer) Authorize(context.Context, consumer.StepRequest, time.Time) (string, error) {
	return "token-secret-value", nil
}

func TestNoHeaderValueTokenOrURLCredentialReachesErrorsOrLogs(t *testing.T) {
	t.Parallel()
	secrets := []string{"url-secret-pass", "query-secret-key", "header-secret-value", "token-secret-value"}
	echo := `{"error":{"message":"you sent header-secret-value and Bearer token-secret-value to /agent?key=query-secret-key"}}`
	deadPort := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		return addr
	}()
	cases := []struct {
		name    string
		replies []agenttest.AgentReply
		dead    bool
	}{
		{"an error echoed through the retries", []agenttest.AgentReply{{Status: 500, Body: echo}, {Status: 500, Body: echo}}, false},
		{"a forbidden echoed", []agenttest.AgentReply{{Status: 403, Body: echo}}, false},
		{"an unauthorized echoed", []agenttest.AgentReply{{Status: 401, Body: echo}}, false},
		{"a refusal echoed", []agenttest.AgentReply{{Status: 422, Body: echo}}, false},
		{"a run error echoed", []agenttest.AgentReply{
			{Frames: []string{agenttest.AGUIRunError("header-secret-value rejected")}},
			{Frames: []string{agenttest.AGUIRunError("Bearer token-secret-value rejected")}},
		}, false},
		{"a malformed frame echoed", []agenttest.AgentReply{{Frames: []string{"header-secret-value"}}}, false},
		{"an agent that is not there", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var logs testenv.SyncBuffer
			log := zerolog.New(&logs).Level(zerolog.DebugLevel)
			host := deadPort
			if !c.dead {
				srv := agenttest.NewAgent(t, c.replies...)
				host = strings.TrimPrefix(srv.URL, "http://")
			}
			x, err := agent.NewExternal(agent.ExternalConfig{
				Protocol: agent.ProtocolAGUI, URL: "http://user:url-secret-pass@" + host + "/agent?key=query-secret-key",
				Headers:    map[string]string{"X-Api-Key": "header-secret-value"},
				Authorizer: secretAuthorizer{}, Logger: &log, MaxRetries: 1, RetryBaseDelay: time.Millisecond,
			})
			require.NoError(t, err)
			_, err = stepOnce(context.Background(), x, turnOf("q"), nil)
			require.Error(t, err)
			texts := []string{err.Error(), logs.String()}
			var u interface{ UserText() string }
			if errors.As(err, &u) {
				texts = append(texts, u.UserText())
			}
			require.NotEmpty(t, logs.String(), "the agent logged")
			for _, text := range texts {
				for _, s := range secrets {
					require.NotContains(t, text, s, "no secret in %q", text)
				}
			}
		})
	}
}
