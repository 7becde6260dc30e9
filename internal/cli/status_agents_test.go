package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/jwtauth"
	"github.com/batonhq/baton/schema"
)

// agentOf returns the agent of protocol in rep, if any.
func agentOf(rep statusReport, protocol string) (schema.AgentEndpoint, bool) {
	for _, a := range rep.Agents {
		if a.Protocol == protocol {
			return a, true
		}
	}
	return schema.AgentEndpoint{}, false
}

// TestStatusShowsAnAgentThatAnsweredAndOneThatRefused runs `baton worker`
// with an AG-UI agent that answers, then with an AI SDK agent whose
// address refuses connections, and reads `baton status`: each agent with
// its protocol and origin, whether it answers, since when, and the last
// error; never the path, the query, a header's value or the URL's
// credentials.
func TestStatusShowsAnAgentThatAnsweredAndOneThatRefused(t *testing.T) {
	t.Parallel()
	s := startStatusStack(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "agent-signing-key.pem")
	_, err := jwtauth.CreateKeyPair(key, filepath.Join(dir, "agent-signing-key.pub"), false)
	require.NoError(t, err)
	const query, header, password = "qu3ry-s3cret-value", "hdr-s3cret-value", "pa55word-s3cret"
	secrets := []string{query, header, password, "/private-route"}

	answering := agenttest.NewAgentResponder(t, func(int, agenttest.AgentRequest) agenttest.AgentReply {
		return agenttest.AgentReply{Frames: agenttest.AGUIRun(agenttest.AGUIText("a", "hello from the agent", 5))}
	})
	stopWorker := start(t, s.args("worker", "--agent", "ag-ui", "--agent-url", answering.URL+"/private-route?token="+query,
		"--agent-header", "X-Api-Key="+header, "--agent-signing-key", key, "--debounce", "0")...)
	s.send("answered", 1)
	rep, _ := s.statusUntil(30*time.Second, nil, nil, func(rep statusReport, _ int) bool {
		a, ok := agentOf(rep, "ag-ui")
		return ok && a.Reachable
	}, "baton status shows the AG-UI agent answering")
	code, stderr := stopWorker()
	require.Equal(t, 0, code, stderr)
	ag, _ := agentOf(rep, "ag-ui")
	require.Equal(t, answering.URL, ag.Origin)
	require.Regexp(t, `^ag-ui `+regexp.QuoteMeta(answering.URL)+` path:[0-9a-f]{8}$`, ag.Name)
	require.NotNil(t, ag.LastOKAt)
	require.Nil(t, ag.LastErrorAt)
	require.WithinDuration(t, time.Now(), ag.Since, time.Minute)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	start(t, s.args("worker", "--agent", "ai-sdk", "--agent-url", "http://baton:"+password+"@"+closed+"/private-route",
		"--agent-signing-key", key, "--debounce", "0")...)
	s.send("refused", 1)
	rep, _ = s.statusUntil(30*time.Second, nil, nil, func(rep statusReport, _ int) bool {
		a, ok := agentOf(rep, "ai-sdk")
		return ok && !a.Reachable
	}, "baton status shows the AI SDK agent refusing")
	refused, _ := agentOf(rep, "ai-sdk")
	require.Equal(t, "http://"+closed, refused.Origin)
	require.Nil(t, refused.LastOKAt)
	require.NotNil(t, refused.LastErrorAt)
	require.Equal(t, "agent_unavailable: the connection failed: dial tcp "+closed+": connect: connection refused", refused.LastError)
	ag, ok := agentOf(rep, "ag-ui")
	require.True(t, ok && ag.Reachable, "the AG-UI agent is still listed as it was last seen")
	require.Empty(t, attentionAbout(rep, "agent"), "an agent failing for less than --stall-after needs no attention: %v", rep.Attention)

	text, _, _ := run(t, s.args("status", "--slot", s.slot, "--max-pending-age", "1h")...)
	t.Logf("baton status:\n%s", text)
	require.Regexp(t, `AGENT\s+REACHABLE\s+SINCE\s+LAST ANSWER\s+LAST ERROR`, text)
	require.Regexp(t, `ag-ui `+regexp.QuoteMeta(answering.URL)+` path:[0-9a-f]{8}\s+yes\s+\d+s ago\s+\d+s ago\s+-\n`, text)
	require.Regexp(t, `ai-sdk http://`+regexp.QuoteMeta(closed)+` path:[0-9a-f]{8}\s+NO\s+\d+s ago\s+-\s+\d+s ago: agent_unavailable: the connection failed: .*connection refused`, text)
	js, _, _ := run(t, s.args("status", "--json", "--slot", s.slot, "--max-pending-age", "1h")...)
	for _, secret := range secrets {
		require.NotContains(t, text, secret)
		require.NotContains(t, js, secret)
	}
}

// TestStatusFlagsAnAgentThatFailedForStallAfterWhileWorkersStillTryIt:
// an agent that has not answered for --stall-after, whose last failure is
// recent, needs attention; one whose last failure is older is no longer
// tried (the workers use another agent now), and is only listed.
func TestStatusFlagsAnAgentThatFailedForStallAfterWhileWorkersStillTryIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	now := time.Now()
	ago := func(d time.Duration) *time.Time { v := now.Add(-d); return &v }
	record := func(name string, r schema.AgentReach) {
		r.Name, r.Protocol, r.Origin = "ag-ui https://"+name+".example.com", "ag-ui", "https://"+name+".example.com"
		require.NoError(t, schema.RecordAgentReach(ctx, db.Pool, r))
	}
	record("failing", schema.AgentReach{Since: *ago(10 * time.Minute), ErrorAt: ago(3 * time.Second), Error: "agent_auth: 401 Unauthorized"})
	record("gone", schema.AgentReach{Since: *ago(time.Hour), ErrorAt: ago(30 * time.Minute), Error: "agent_unavailable: 502 Bad Gateway"})
	record("blip", schema.AgentReach{Since: *ago(2 * time.Second), ErrorAt: ago(2 * time.Second), Error: "agent_timeout: stalled"})
	record("fine", schema.AgentReach{Reachable: true, Since: *ago(time.Hour), OKAt: ago(time.Second)})

	out, stderr, code := run(t, "status", "--json", "--database-url", db.URL, "--nats-url", ns.URL)
	require.Equal(t, 3, code, stderr)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Agents, 4)
	var flagged []string
	for _, a := range rep.Attention {
		if strings.HasPrefix(a, "agent ") {
			flagged = append(flagged, a)
		}
	}
	require.Len(t, flagged, 1, "only the agent failing for 10 minutes and tried 3s ago: %v", rep.Attention)
	require.Regexp(t, `^agent ag-ui https://failing\.example\.com has not answered a step request for 10m\d+s \(--stall-after 5m0s\); the last error, [\d.]+s ago: agent_auth: 401 Unauthorized: check that it runs and speaks ag-ui at the workers' BATON_AGENT_URL \(--agent-url\)`, flagged[0])
}
