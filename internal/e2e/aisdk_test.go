package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/agent"
	"github.com/batonhq/baton/agent/agenttest"
	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// clientResult is what read.mjs prints: the message the AI SDK's client
// ends with.
type clientResult struct {
	ID       string          `json:"id"`
	Text     string          `json:"text"`
	Metadata json.RawMessage `json:"metadata"`
	Deltas   int             `json:"deltas"`
}

// TestTheAISDKClientsOfBothMajorsReadBatonsStreams: the DefaultChatTransport
// and readUIMessageStream of ai 6 and ai 7, unchanged, read a reply, a
// resumed reply (a second client reconnecting mid-reply) and a stopped
// reply; each ends with the reply as Baton stored it, under the id the
// history gives it, the same for both majors.
func TestTheAISDKClientsOfBothMajorsReadBatonsStreams(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(repoDir(), "internal", "e2e", "aisdk")
	npmReady(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	nc, js := ns.Connect(t)
	_, _, err := batonnats.ProvisionEventsStream(ctx, js, batonnats.EventsConfig{}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	model := agenttest.NewResponder(t, chatModel)
	a, err := agent.NewOpenAI(agent.Config{BaseURL: model.BaseURL(), Model: "test"})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunStack(ctx, cli.StackConfig{Pool: db.Pool, NATS: nc,
			Relay:  relay.Config{Slot: "slot_" + db.Name, Publication: "pub_" + db.Name},
			Worker: consumer.Config{Agent: a},
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	token, user, err := schema.CreateToken(ctx, db.Pool, "sdk")
	require.NoError(t, err)
	srv, err := api.New(api.Config{Pool: db.Pool, JetStream: js, NATS: nc, MessagesPerMinute: 10000, MessageBurst: 1000})
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Close)

	run := func(t *testing.T, version, scenario, chat, text string) map[string]clientResult {
		t.Helper()
		cmd := exec.Command("node", "read.mjs", version, scenario, hs.URL, token, chat, chat+"-m1", text)
		cmd.Dir = dir
		out, err := cmd.Output()
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		require.NoError(t, err, "node read.mjs %s %s: %s", version, scenario, stderr)
		var res map[string]clientResult
		require.NoError(t, json.Unmarshal(out, &res), "%s", out)
		return res
	}
	stored := func(t *testing.T, chat string) (id, content string, stopped bool) {
		t.Helper()
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT m.id, m.content, m.stopped FROM messages m JOIN conversations c ON c.id = m.conversation_id
			WHERE c.owner_id = $1 AND c.public_id = $2 AND m.role = 'assistant'`, user.ID, chat).Scan(&id, &content, &stopped))
		return id, content, stopped
	}

	texts := map[string]map[string]string{} // scenario -> version -> text
	for _, scenario := range []struct{ name, text string }{{"reply", "the same question"}, {"resume", "slow 60"}, {"stop", "slow 400"}} {
		texts[scenario.name] = map[string]string{}
		for _, version := range []string{"v6", "v7"} {
			chat := fmt.Sprintf("%s-%s", scenario.name, version)
			res := run(t, version, scenario.name, chat, scenario.text)
			id, content, stopped := stored(t, chat)
			reply := res["reply"]
			require.Equal(t, id, reply.ID, "%s %s: the client's message has the stored reply's id", version, scenario.name)
			require.Equal(t, content, reply.Text, "%s %s: the client ends with the stored reply", version, scenario.name)
			texts[scenario.name][version] = reply.Text
			switch scenario.name {
			case "reply":
				require.Equal(t, "echo: the same question", reply.Text)
				require.Equal(t, "null", string(reply.Metadata))
			case "resume":
				require.Equal(t, agenttest.Steady(60, 0).Content, reply.Text)
				resumed := res["resumed"]
				require.Equal(t, reply, clientResult{ID: resumed.ID, Text: resumed.Text, Metadata: resumed.Metadata, Deltas: reply.Deltas},
					"%s: the resumed reply is the same message", version)
			case "stop":
				require.True(t, stopped)
				require.JSONEq(t, `{"stopped":true}`, string(reply.Metadata), "%s: the finish says the reply was stopped", version)
				require.NotContains(t, reply.Text, "w400", "stopped mid-reply")
			}
		}
	}
	require.Equal(t, texts["reply"]["v6"], texts["reply"]["v7"])
	require.Equal(t, texts["resume"]["v6"], texts["resume"]["v7"])
}
