package agent_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/consumer"
)

// outcomes records what OnOutcome was told.
type outcomes struct {
	mu  sync.Mutex
	all []agent.EndpointOutcome
}

func (o *outcomes) add(out agent.EndpointOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = append(o.all, out)
}

func (o *outcomes) errors() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, x := range o.all {
		out = append(out, x.Error)
	}
	return out
}

// closedURL is a URL on which nothing listens: every connection is
// refused.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr + "/agent"
}

func TestAnExternalAgentsMetricsCountEveryRequestByOutcomeStatusClassAndReason(t *testing.T) {
	t.Parallel()
	w := wires[0]
	reg := prometheus.NewRegistry()
	var seen outcomes
	setup := func(cfg *agent.ExternalConfig) {
		cfg.Registerer = reg
		cfg.OnOutcome = seen.add
	}

	// A 500, retried; then an answer.
	srv := agenttest.NewAgent(t,
		agenttest.AgentReply{Status: 500, Body: `{"error":"the database is down"}`},
		agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))},
	)
	_, err := stepOnce(context.Background(), newExternal(t, w.protocol, srv, setup), turnOf("q"), nil)
	require.NoError(t, err)

	// A refusal of the credentials: the step fails at once.
	refusing := agenttest.NewAgent(t, agenttest.AgentReply{Status: 401, Body: `{"error":"bad token"}`})
	_, err = stepOnce(context.Background(), newExternal(t, w.protocol, refusing, setup), turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentAuth)

	// Nothing listens: no HTTP answer, retried once, then the step fails.
	x, err := agent.NewExternal(agent.ExternalConfig{Protocol: w.protocol, URL: closedURL(t), MaxRetries: 1,
		RetryBaseDelay: 1, MaxRetryDelay: 1, Registerer: reg, OnOutcome: seen.add})
	require.NoError(t, err)
	_, err = stepOnce(context.Background(), x, turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentUnavailable)

	// An answer with nothing in it: the agent answered, the step fails.
	empty := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step()})
	_, err = stepOnce(context.Background(), newExternal(t, w.protocol, empty, setup), turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrEmptyReply)

	p := w.protocol
	requests := func(class string) float64 {
		return sample(t, reg, "baton_agent_requests_total", map[string]string{"protocol": p, "class": class})
	}
	require.Equal(t, 2.0, requests("2xx"), "the answer and the empty answer")
	require.Equal(t, 1.0, requests("4xx"))
	require.Equal(t, 1.0, requests("5xx"))
	require.Equal(t, 2.0, requests("transport"), "the refused connection and its retry")
	errs := func(reason string) float64 {
		return sample(t, reg, "baton_agent_errors_total", map[string]string{"protocol": p, "reason": reason})
	}
	require.Equal(t, 3.0, errs("agent_unavailable"), "the 500 and both refused connections")
	require.Equal(t, 1.0, errs("agent_auth"))
	require.Equal(t, 1.0, errs("empty_reply"))
	require.Zero(t, errs("agent_timeout"), "a reason with no failure is a series at 0")
	steps := map[string]float64{}
	for _, o := range []string{"ok", "retried", "failed"} {
		steps[o] = sample(t, reg, "baton_agent_step_seconds", map[string]string{"protocol": p, "outcome": o})
	}
	require.Equal(t, map[string]float64{"ok": 1, "retried": 2, "failed": 3}, steps,
		"ok: the answer; retried: the 500 and the first refused connection; failed: the 401, the second refused connection, the empty answer")
	require.Zero(t, sample(t, reg, "baton_agent_in_flight", map[string]string{"protocol": p}), "nothing is in flight once the steps ended")

	// What OnOutcome heard: an answer is one whatever it said.
	refused := "agent_unavailable: the connection failed: dial tcp " + strings.TrimPrefix(x.Endpoint().Origin, "http://") + ": connect: connection refused"
	require.Equal(t, []string{
		"agent_unavailable: 500 Internal Server Error: the database is down", "",
		"agent_auth: 401 Unauthorized",
		refused, refused,
		"",
	}, seen.errors())

	// No label holds the URL, its host or its path.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				require.NotContains(t, l.GetValue(), "127.0.0.1", "%s{%s}", mf.GetName(), l.GetName())
				require.NotContains(t, l.GetValue(), "/agent", "%s{%s}", mf.GetName(), l.GetName())
			}
		}
	}
}

func TestAgentsOfBothProtocolsShareTheMetricsOfOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for _, w := range wires {
		srv := agenttest.NewAgent(t, agenttest.AgentReply{Frames: w.step(w.text("a", "ok", 2))})
		x := newExternal(t, w.protocol, srv, func(cfg *agent.ExternalConfig) { cfg.Registerer = reg })
		_, err := stepOnce(context.Background(), x, turnOf("q"), nil)
		require.NoError(t, err)
	}
	for _, w := range wires {
		require.Equal(t, 1.0, sample(t, reg, "baton_agent_requests_total", map[string]string{"protocol": w.protocol, "class": "2xx"}), w.protocol)
	}
}

func TestOnOutcomeNeverHoldsAHeaderValueATokenOrTheURLsCredentials(t *testing.T) {
	t.Parallel()
	const header, password, query = "hdr-5ecret-value", "pa55-secret-word", "k3y-in-the-query"
	// The agent echoes what it was sent in its failures.
	srv := agenttest.NewAgentResponder(t, func(n int, req agenttest.AgentRequest) agenttest.AgentReply {
		echo := req.Header.Get("X-Api-Key") + " " + req.Header.Get("Authorization")
		if n == 0 {
			return agenttest.AgentReply{Status: 502, Body: `{"error":"upstream refused ` + echo + `"}`}
		}
		return agenttest.AgentReply{Status: 403, Body: `{"error":"not with ` + echo + `"}`}
	})
	var seen outcomes
	url := strings.Replace(srv.URL, "http://", "http://baton:"+password+"@", 1) + "/agent?key=" + query
	x, err := agent.NewExternal(agent.ExternalConfig{Protocol: agent.ProtocolAGUI, URL: url, Headers: map[string]string{"X-Api-Key": header},
		Authorizer: fixedToken("st3p-token-value"), RetryBaseDelay: 1, MaxRetryDelay: 1, OnOutcome: seen.add})
	require.NoError(t, err)
	_, err = stepOnce(context.Background(), x, turnOf("q"), nil)
	require.ErrorIs(t, err, agent.ErrAgentAuth)
	errs := seen.errors()
	require.Len(t, errs, 2)
	require.Contains(t, errs[0], "agent_unavailable: 502 Bad Gateway: upstream refused [redacted] Bearer [redacted]")
	require.Equal(t, "agent_auth: 403 Forbidden", errs[1])
	for _, o := range seen.all {
		for _, s := range []string{header, password, query, "st3p-token-value", "/agent"} {
			require.NotContains(t, o.Error+" "+o.Endpoint.Name+" "+o.Endpoint.Origin, s)
		}
		require.Equal(t, x.Endpoint(), o.Endpoint)
	}
}

func TestAnEndpointIsNamedByProtocolOriginAndAHashOfTheRest(t *testing.T) {
	t.Parallel()
	e := agent.EndpointOf(agent.ProtocolAGUI, "https://user:pw@agent.example.com:8443/api/agent?key=s3cret")
	require.Equal(t, "https://agent.example.com:8443", e.Origin)
	require.Equal(t, agent.ProtocolAGUI, e.Protocol)
	require.Regexp(t, `^ag-ui https://agent\.example\.com:8443 path:[0-9a-f]{8}$`, e.Name)
	for _, s := range []string{"user", "pw", "api", "s3cret"} {
		require.NotContains(t, e.Name, s)
	}
	other := agent.EndpointOf(agent.ProtocolAGUI, "https://agent.example.com:8443/api/other")
	require.NotEqual(t, e.Name, other.Name, "two agents of one origin are two endpoints")
	require.Equal(t, e.Name, agent.EndpointOf(agent.ProtocolAGUI, "https://agent.example.com:8443/api/agent?key=s3cret").Name,
		"the credentials are not part of the name")
	require.Equal(t, "ai-sdk http://127.0.0.1:3000", agent.EndpointOf(agent.ProtocolAISDK, "http://127.0.0.1:3000/").Name)
}

// fixedToken authorizes every request with one token.
type fixedToken string

func (f fixedToken) Authorize(context.Context, consumer.StepRequest, time.Time) (string, error) {
	return string(f), nil
}

// sample is the value of the counter or gauge name with labels in reg, or
// the count of the histogram.
func sample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := len(m.GetLabel()) == len(labels)
			for _, l := range m.GetLabel() {
				match = match && labels[l.GetName()] == l.GetValue()
			}
			if match {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}
