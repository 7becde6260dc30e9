package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/proctest"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// groupStack is a database with a streaming relay, and the role of the
// Node group (examples/group-node), made as its README makes it.
type groupStack struct {
	*outboxtest.Bundle
	repo string
	// schema is the group role's schema, which holds event_counts.
	schema string
	// env is what the group runs with, as its README sets it.
	env []string
}

// The secrets the group is given, which nothing it writes may show.
const (
	groupDBPassword   = "db-pw-0f3a9c"
	groupNATSPassword = "nats-pw-7d21b4"
)

// readmeShellLines returns the lines of the ```sh blocks of a Markdown
// page that come before the heading stop.
func readmeShellLines(t *testing.T, page, stop string) []string {
	t.Helper()
	text, err := os.ReadFile(page)
	require.NoError(t, err)
	var lines []string
	in := false
	for _, line := range strings.Split(string(text), "\n") {
		switch {
		case line == stop:
			return lines
		case line == "```sh":
			in = true
		case in && line == "```":
			in = false
		case in:
			lines = append(lines, line)
		}
	}
	t.Fatalf("%s has no heading %q", page, stop)
	return nil
}

// groupReadmeRunsHere are the lines of the README that the test does
// itself: baton dev and its file, the packages that make test-deps
// installed, and the group's commands, which it runs with the
// environment the README's lines set.
var groupReadmeRunsHere = []string{
	"make dev",
	"source .baton/dev.env",
	"npm ci --prefix examples/group-node",
	"node examples/group-node/group.js",
	"node examples/group-node/group.js replay --all",
}

func startGroupStack(t *testing.T) *groupStack {
	t.Helper()
	ctx := context.Background()
	repo := repoPath(t, ".")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed: run make test-deps (it installs Debian's nodejs and runs npm ci in examples/group-node)")
	}
	if _, err := os.Stat(filepath.Join(repo, "examples", "group-node", "node_modules", "@nats-io", "jetstream", "package.json")); err != nil {
		t.Fatalf("the example's packages are not installed in examples/group-node: run make test-deps (npm ci there)")
	}
	s := &groupStack{Bundle: outboxtest.Setup(t), repo: repo, schema: "counts"}
	s.RelayStreaming()

	// The README's commands before "## Configuration", in one bash script
	// from the repository, as a reader runs them against make dev: they
	// make the group's role, its schema and its table, and set
	// BATON_DATABASE_URL to the role's. Roles belong to the whole server.
	t.Cleanup(func() {
		for _, sql := range []string{`DROP SCHEMA IF EXISTS counts CASCADE`, `DROP OWNED BY counts, baton_group`, `DROP ROLE IF EXISTS counts`, `DROP ROLE IF EXISTS baton_group`} {
			_, _ = s.DB.Pool.Exec(context.Background(), sql)
		}
	})
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	lines := readmeShellLines(t, filepath.Join(repo, "examples", "group-node", "README.md"), "## Configuration")
	for _, want := range groupReadmeRunsHere {
		require.Contains(t, lines, want, "the README runs %q, which the test stands in for", want)
	}
	for _, line := range lines {
		if !slices.Contains(groupReadmeRunsHere, line) {
			script.WriteString(line + "\n")
		}
	}
	script.WriteString(`printf '%s\n' "$BATON_DATABASE_URL"` + "\n")
	bin, err := pgcluster.FindBinDir()
	require.NoError(t, err)
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "BATON_DATABASE_URL="+s.DB.URL, "PATH="+bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the README's commands must all succeed\nscript:\n%s\noutput:\n%s", script.String(), out)
	printed := strings.Split(strings.TrimSpace(string(out)), "\n")
	u, err := url.Parse(printed[len(printed)-1])
	require.NoError(t, err)
	require.Equal(t, "counts", u.User.Username(), "the README's BATON_DATABASE_URL connects as the group's role")

	// The test cluster trusts local connections, so a password is never
	// checked, only carried: the group must not show it.
	_, err = s.DB.Pool.Exec(ctx, `ALTER ROLE counts PASSWORD '`+groupDBPassword+`'`)
	require.NoError(t, err)
	u.User = url.UserPassword("counts", groupDBPassword)
	n, err := url.Parse(s.NATS.URL)
	require.NoError(t, err)
	n.User = url.UserPassword("counts", groupNATSPassword)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "BATON_") {
			s.env = append(s.env, e)
		}
	}
	s.env = append(s.env,
		"BATON_DATABASE_URL="+u.String(),
		"BATON_NATS_URL="+n.String(),
		"BATON_STREAM="+s.Stream.Name,
		// What the killed process held comes back after the ack wait.
		"BATON_GROUP_ACK_WAIT=2s",
		"BATON_GROUP_MAX_ATTEMPTS=3",
		"BATON_GROUP_RETRY_MIN=50ms",
		"BATON_GROUP_RETRY_MAX=200ms",
	)
	return s
}

// node starts `node examples/group-node/group.js args...` from the
// repository, as the README runs it, with the stack's environment and
// extra variables, and stops it when the test ends. Nothing it writes may
// hold the secrets it was given.
func (s *groupStack) node(t *testing.T, extraEnv []string, args ...string) *proctest.Process {
	t.Helper()
	cmd := exec.Command("node", append([]string{"examples/group-node/group.js"}, args...)...)
	cmd.Dir = s.repo
	cmd.Env = append(append([]string{}, s.env...), extraEnv...)
	p, err := proctest.Start(strings.Join(cmd.Args, " "), cmd, proctest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s, its last lines:\n%s", p.Name, p.Tail(30))
		}
		for _, secret := range []string{groupDBPassword, groupNATSPassword} {
			require.NotContains(t, p.Text(""), secret, "%s wrote a secret it was given", p.Name)
		}
	})
	return p
}

// applied counts the events in the group's inbox.
func (s *groupStack) applied() int {
	return s.Count(`SELECT count(*) FROM group_inbox WHERE group_name = 'counts'`)
}

// counted returns the group's count of a conversation's events.
func (s *groupStack) counted(conversation string) int {
	return s.Count(`SELECT coalesce(sum(events), 0) FROM `+s.schema+`.event_counts WHERE conversation_id = $1`, s.Key(conversation))
}

// total returns the sum of the group's counts.
func (s *groupStack) total() int {
	return s.Count(`SELECT coalesce(sum(events), 0) FROM ` + s.schema + `.event_counts`)
}

// deadLetters returns the group's parked events, resolved ones too, by
// event id.
func (s *groupStack) deadLetters(t *testing.T) map[string]schema.DeadLetter {
	t.Helper()
	list, err := schema.DeadLetters(context.Background(), s.DB.Pool, "counts", true)
	require.NoError(t, err)
	byID := map[string]schema.DeadLetter{}
	for _, d := range list {
		byID[d.EventID] = d
	}
	return byID
}

// TestTheNodeGroupAppliesEachEventOnce runs examples/group-node as its
// user would, with node, after its README's commands, against a real
// relay, and proves that a group in another language keeps the guarantees
// of a Go one: every event applied once, also when the process is killed
// mid-way and started again, when its durable consumer is deleted under
// it, and when the whole stream is replayed, by its own replay or by
// baton's; an event that does not match the published schema, or whose
// effect keeps failing, is parked in group_dead_letters and the group goes
// on; it stops cleanly on SIGTERM; and it refuses a durable consumer it
// cannot use, waits for a stream that does not exist yet, and never writes
// a secret it was given.
func TestTheNodeGroupAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	s := startGroupStack(t)
	ctx := context.Background()

	// Killed with SIGKILL mid-way and started again: each event once.
	const sent, conversations = 400, 8
	s.SendMany(sent, conversations, "c")
	g := s.node(t, nil)
	g.WaitLine(t, 30*time.Second, `"group started"`)
	s.Eventually(30*time.Second, func() bool { return s.applied() >= 40 }, "the group applies events")
	g.Kill()
	require.Less(t, s.applied(), sent, "the group is killed before it applied every event")
	g = s.node(t, nil)
	s.Eventually(30*time.Second, func() bool { return s.applied() == sent }, "the restarted group applies the rest")
	for c := range conversations {
		require.Equal(t, sent/conversations, s.counted(fmt.Sprintf("c.%d", c)), "conversation c.%d: each of its events counted once", c)
	}
	require.Equal(t, sent, s.total(), "every event counted once")

	// A malformed trigger published straight to the stream is parked, not
	// applied, and the group goes on with the conversation's next event.
	bad := natsclient.NewMsg(batonnats.Subject(s.Stream.SubjectPrefix, s.Stream.Partitions, s.Key("c.0")))
	bad.Header.Set("Nats-Msg-Id", "outbox-900001")
	bad.Header.Set("Baton-Outbox-Id", "900001")
	bad.Data = []byte(`{"outbox_id": 900001, "conversation_id": "` + s.Key("c.0") + `", "reason": "insert", "created_at": "yesterday"}`)
	_, err := s.JS.PublishMsg(ctx, bad)
	require.NoError(t, err)
	s.Send("c.0", "after-the-malformed-one", "hello")
	s.Eventually(30*time.Second, func() bool { return s.applied() == sent+1 }, "the group applies the event after the malformed one")
	require.Equal(t, [2]int{sent/conversations + 1, sent + 1}, [2]int{s.counted("c.0"), s.total()}, "the malformed event is not counted")
	require.Equal(t, 0, s.Count(`SELECT count(*) FROM group_inbox WHERE group_name = 'counts' AND event_id = 'outbox-900001'`), "the malformed event is not in the inbox")
	parked := s.deadLetters(t)
	require.Len(t, parked, 1, "the malformed event is parked")
	malformed, ok := parked["outbox-900001"]
	require.True(t, ok, "the dead letter is named by the event's Nats-Msg-Id: %v", parked)
	require.NotNil(t, malformed.OutboxID, "the dead letter names the row its headers name")
	require.Equal(t, int64(900001), *malformed.OutboxID)
	require.Equal(t, 1, malformed.Attempts, "a malformed event is parked at its first delivery")
	for _, want := range []string{"malformed event", "trigger.schema.json", "message_id", "date-time"} {
		require.Contains(t, malformed.Error, want, "the dead letter says why the event does not match the schema")
	}
	var headers map[string][]string
	require.NoError(t, json.Unmarshal(malformed.Headers, &headers))
	require.Equal(t, []string{"outbox-900001"}, headers["Nats-Msg-Id"], "the dead letter keeps the headers as the Go groups do")
	g.WaitLine(t, 10*time.Second, `"event parked in group_dead_letters"`, `outbox-900001`, `malformed event`)

	// The durable deleted under the running group: it creates it again,
	// which starts from the stream's first event; every applied one is in
	// the inbox already (the malformed one is parked again), and the next
	// new event is applied.
	require.NoError(t, s.JS.DeleteConsumer(ctx, s.Stream.Name, "counts"))
	g.WaitLine(t, 30*time.Second, `"durable consumer was gone; created it again and rejoined"`)
	s.Send("c.2", "after-the-rejoin", "hello")
	s.Eventually(30*time.Second, func() bool { return s.applied() == sent+2 }, "the group applies events after it rejoined")
	s.ConsumerSettled("counts", 30*time.Second)
	require.Equal(t, sent+2, s.total(), "going through the stream again after the rejoin counted nothing twice")

	// An effect that keeps failing (here a constraint the group's table
	// refuses) is tried BATON_GROUP_MAX_ATTEMPTS times, then parked; the
	// group goes on meanwhile.
	s.Conversation("poison")
	_, err = s.DB.Pool.Exec(ctx, `ALTER TABLE `+s.schema+`.event_counts ADD CONSTRAINT no_poison CHECK (conversation_id <> '`+s.Key("poison")+`')`)
	require.NoError(t, err)
	poison := s.Send("poison", "p1", "hello")
	s.Send("c.1", "beside-the-poison", "hello")
	s.Eventually(30*time.Second, func() bool { return len(s.deadLetters(t)) == 2 }, "the event whose effect keeps failing is parked")
	poisonID := "outbox-" + strconv.FormatInt(poison, 10)
	failing := s.deadLetters(t)[poisonID]
	require.Equal(t, 3, failing.Attempts, "parked after BATON_GROUP_MAX_ATTEMPTS deliveries")
	require.Contains(t, failing.Error, "no_poison")
	s.Eventually(30*time.Second, func() bool { return s.applied() == sent+3 }, "the group applies the other conversation's event")
	g.WaitLine(t, time.Second, `"handler failed; event will be delivered again"`, `no_poison`)

	// SIGTERM: the group stops cleanly.
	g.Stop(10 * time.Second)
	require.Equal(t, 0, g.ExitCode(), "the group exits 0 after SIGTERM; its last lines:\n%s", g.Tail(10))
	g.WaitLine(t, time.Second, `"group stopped"`)

	// A replay from the start of retention applies nothing twice: the
	// event parked for its effect, fixed since, is applied now and its
	// dead letter resolved; the malformed one is parked again.
	_, err = s.DB.Pool.Exec(ctx, `ALTER TABLE `+s.schema+`.event_counts DROP CONSTRAINT no_poison`)
	require.NoError(t, err)
	r := s.node(t, nil, "replay", "--all")
	require.Equal(t, 0, r.Wait(t, 60*time.Second), "the replay succeeds; its last lines:\n%s", r.Tail(10))
	type summary struct{ Total, Applied, Duplicate, Parked, Retry int }
	var got summary
	require.NoError(t, json.Unmarshal([]byte(r.Text("stdout")), &got), "the replay prints its summary as JSON: %q", r.Text("stdout"))
	stored := sent + 5 // the messages, the malformed trigger and the four sent since
	require.Equal(t, summary{Total: stored, Applied: 1, Duplicate: stored - 2, Parked: 1}, got)
	require.Equal(t, sent+4, s.applied())
	require.Equal(t, [2]int{1, sent + 4}, [2]int{s.counted("poison"), s.total()}, "the replay counted only the event that had been parked")
	parked = s.deadLetters(t)
	require.Len(t, parked, 2)
	require.Nil(t, parked["outbox-900001"].ResolvedAt, "the malformed event stays parked")
	require.Equal(t, 3, parked["outbox-900001"].Parked, "the rejoin and the replay parked the malformed event again")
	require.NotNil(t, parked[poisonID].ResolvedAt, "the event applied by the replay is no longer dead")
	require.Equal(t, schema.ResolutionApplied, parked[poisonID].Resolution)

	// baton replay drives the group too: it resets the durable in place
	// and waits for the group's running processes, which apply nothing
	// twice.
	g = s.node(t, nil)
	g.WaitLine(t, 30*time.Second, `"group started"`)
	res, err := group.Replay(ctx, group.ReplayConfig{JetStream: s.JS, Stream: s.Stream, Group: "counts", From: group.Position{All: true}})
	require.NoError(t, err)
	require.Equal(t, uint64(stored), res.Total)
	g.Stop(10 * time.Second)
	g.WaitLine(t, time.Second, `"group stopped"`, `"applied":0`, fmt.Sprintf(`"duplicate":%d`, stored-1), `"parked":1`)
	require.Equal(t, [2]int{sent + 4, sent + 4}, [2]int{s.applied(), s.total()}, "baton replay applied nothing twice")
	require.Equal(t, 4, s.deadLetters(t)["outbox-900001"].Parked, "baton replay parked the malformed event again")

	// A durable of the group's name made otherwise is refused, with what
	// to do about it.
	_, err = s.JS.CreateConsumer(ctx, s.Stream.Name, jetstream.ConsumerConfig{
		Durable: "elsewhere", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy,
	})
	require.NoError(t, err)
	refused := s.node(t, []string{"BATON_GROUP=elsewhere"})
	require.Equal(t, 1, refused.Wait(t, 30*time.Second), "a durable the group cannot use is refused; its last lines:\n%s", refused.Tail(10))
	refused.WaitLine(t, time.Second, `"refusing to start"`, `deliver policy new`, `nats consumer rm`)

	// A stream that does not exist (yet) is waited for, with a clear
	// message, until SIGTERM.
	waiting := s.node(t, []string{"BATON_STREAM=NOT_YET"})
	waiting.WaitLine(t, 30*time.Second, `"waiting for the outbox stream"`, `stream NOT_YET does not exist`, `baton relay`)
	waiting.Stop(10 * time.Second)
	require.Equal(t, 0, waiting.ExitCode(), "a group waiting for its stream stops cleanly")
	// A replay, which a person runs, says so at once.
	noStream := s.node(t, []string{"BATON_STREAM=NOT_YET"}, "replay", "--all")
	require.Equal(t, 1, noStream.Wait(t, 30*time.Second), "a replay without its stream fails")
	noStream.WaitLine(t, time.Second, `"refusing to start"`, `stream NOT_YET does not exist`)
}
