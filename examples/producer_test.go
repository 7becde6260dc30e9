// Package examples_test runs the producer examples (examples/producer-go,
// producer-node, producer-python) as their users run them, against a real
// PostgreSQL with a running relay and worker: each writes a row of the
// shop's own table (examples/shop.sql) and a message through Baton's SQL
// producer in one transaction, as a role that is only a member of
// baton_producer.
package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/pgcluster"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// stack is one database with a relay, a worker and the shop's role, shared
// by the examples of every language.
type stack struct {
	*outboxtest.Bundle
	// shopURL connects as the shop's role, a member of baton_producer.
	shopURL string
}

func startStack(t *testing.T) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{Bundle: outboxtest.Setup(t)}
	s.RelayStreaming()
	w, err := consumer.New(consumer.Config{
		Stream: s.Stream, Agent: consumer.Echo{}, Debounce: consumer.NoDebounce,
	}, s.DB.Pool, s.JS)
	require.NoError(t, err)
	outboxtest.RunInBackground(t, "worker", w.Run)

	// The shop's role, as docs/guides/producing.md makes it: a member of
	// baton_producer with a schema of its own. Roles belong to the whole
	// server; the role's name is the database's, so that tests on one
	// server never share one.
	role := "shop_" + s.DB.Name
	for _, sql := range []string{
		`DO $$ BEGIN CREATE ROLE baton_producer; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT baton_producer TO ` + role,
		`CREATE SCHEMA ` + role + ` AUTHORIZATION ` + role,
		`SELECT baton_apply_grants()`,
	} {
		_, err := s.DB.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		_, _ = s.DB.Pool.Exec(context.Background(), `DROP SCHEMA `+role+` CASCADE`)
		_, _ = s.DB.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(s.DB.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	s.shopURL = u.String()

	// examples/shop.sql, run with psql as the guide runs it.
	bin, err := pgcluster.FindBinDir()
	require.NoError(t, err)
	out, err := exec.Command(filepath.Join(bin, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-q", s.shopURL, "-f", "shop.sql").CombinedOutput()
	require.NoError(t, err, "psql -f examples/shop.sql as the shop's role: %s", out)
	return s
}

// customer makes name one of the shop's customers.
func (s *stack) customer(t *testing.T, name string) {
	t.Helper()
	_, err := s.DB.Pool.Exec(context.Background(), `INSERT INTO shop_`+s.DB.Name+`.customers (name) VALUES ($1)`, name)
	require.NoError(t, err)
}

// rows counts what is stored for a user (and whether users of the other
// names exist): an error must change none of it.
func (s *stack) rows(t *testing.T, user string, others ...string) string {
	t.Helper()
	var n [6]int
	err := s.DB.Pool.QueryRow(context.Background(), `
		WITH c AS (SELECT c.id FROM conversations c JOIN users u ON u.id = c.owner_id WHERE u.name = $1)
		SELECT (SELECT count(*) FROM users WHERE name = $1),
		       (SELECT count(*) FROM users WHERE name = ANY ($2)),
		       (SELECT count(*) FROM c),
		       (SELECT count(*) FROM messages WHERE conversation_id IN (SELECT id FROM c)),
		       (SELECT count(*) FROM agent_outbox WHERE conversation_id IN (SELECT id FROM c)),
		       (SELECT count(*) FROM shop_`+s.DB.Name+`.support_requests WHERE customer = $1)`, user, others).
		Scan(&n[0], &n[1], &n[2], &n[3], &n[4], &n[5])
	require.NoError(t, err)
	return fmt.Sprintf("users %d, other users %d, conversations %d, messages %d, outbox rows %d, support requests %d", n[0], n[1], n[2], n[3], n[4], n[5])
}

// reply waits for the reply of the worker's turn that answered the
// message with this key, and returns it.
func (s *stack) reply(t *testing.T, messageKey string) string {
	t.Helper()
	var content string
	s.Eventually(60*time.Second, func() bool {
		err := s.DB.Pool.QueryRow(context.Background(), `
			SELECT m.content FROM messages m JOIN agent_runs r ON r.id = m.run_id
			WHERE m.role = 'assistant' AND r.status = 'finalized'
			  AND (SELECT o.id FROM agent_outbox o WHERE o.message_id = $1) = ANY (r.outbox_ids)`, messageKey).Scan(&content)
		return err == nil
	}, "the worker replies to message %s", messageKey)
	return content
}

// turns counts the turns that answered the message with this key, and the
// replies of its conversation.
func (s *stack) turns(t *testing.T, messageKey string) (turns, replies int) {
	t.Helper()
	err := s.DB.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM agent_runs r WHERE r.status = 'finalized'
		          AND (SELECT o.id FROM agent_outbox o WHERE o.message_id = $1) = ANY (r.outbox_ids)),
		       (SELECT count(*) FROM messages r WHERE r.role = 'assistant'
		          AND r.conversation_id = (SELECT conversation_id FROM messages WHERE id = $1))`, messageKey).Scan(&turns, &replies)
	require.NoError(t, err)
	return turns, replies
}

// published returns how many events the outbox stream holds for the
// conversation of the given key, and the message key of the last one.
func (s *stack) published(t *testing.T, conversationKey string) (n uint64, lastMessageKey string) {
	t.Helper()
	ctx := context.Background()
	subject := batonnats.Subject(s.Stream.SubjectPrefix, s.Stream.Partitions, conversationKey)
	stream, err := s.JS.Stream(ctx, s.Stream.Name)
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	n = info.State.Subjects[subject]
	if n > 0 {
		last, err := stream.GetLastMsgForSubject(ctx, subject)
		require.NoError(t, err)
		lastMessageKey = last.Header.Get("Baton-Message-Id")
	}
	return n, lastMessageKey
}

// example is one producer example and how its user runs it.
type example struct {
	name string
	// command is the example's command line with args, in the folder its
	// guide runs it from.
	command func(t *testing.T, args ...string) *exec.Cmd
}

// result is what an example printed and how it ended.
type result struct {
	stdout, stderr string
	code           int
}

// start starts the example with DATABASE_URL set, as its user runs it.
func (e example) start(t *testing.T, s *stack, stdin string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := e.command(t, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+s.shopURL)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start(), "start the %s example", e.name)
	return cmd, &stdout, &stderr
}

// wait waits for an example started by start to end.
func wait(cmd *exec.Cmd, stdout, stderr *bytes.Buffer) (result, error) {
	err := cmd.Wait()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		r.code, err = exit.ExitCode(), nil
	}
	return r, err
}

func (e example) run(t *testing.T, s *stack, stdin string, args ...string) result {
	t.Helper()
	r, err := wait(e.start(t, s, stdin, args...))
	require.NoError(t, err, "run the %s example", e.name)
	return r
}

// parse reads the answer an example printed, after it succeeded.
func (e example) parse(r result, args []string) (answer, error) {
	var a answer
	if r.code != 0 {
		return a, fmt.Errorf("%s %q should succeed; exit code %d, stderr: %s", e.name, args, r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &a); err != nil {
		return a, fmt.Errorf("%s prints its answer as JSON, not %q: %w", e.name, r.stdout, err)
	}
	return a, nil
}

// answer is what start and send print.
type answer struct {
	ConversationKey string `json:"conversation_key"`
	MessageKey      string `json:"message_key"`
	Existed         bool   `json:"existed"`
}

// ok runs the example and expects it to succeed.
func (e example) ok(t *testing.T, s *stack, stdin string, args ...string) answer {
	t.Helper()
	a, err := e.parse(e.run(t, s, stdin, args...), args)
	require.NoError(t, err)
	return a
}

// fail runs the example, expects it to exit 1, and returns what it printed
// on stderr.
func (e example) fail(t *testing.T, s *stack, stdin string, args ...string) string {
	t.Helper()
	r := e.run(t, s, stdin, args...)
	require.Equal(t, 1, r.code, "%s %q should fail; stdout: %s stderr: %s", e.name, args, r.stdout, r.stderr)
	return r.stderr
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", rel))
	require.NoError(t, err)
	return p
}

// nodeExample is `node index.js` in examples/producer-node, with the
// modules that `npm ci` installs there.
func nodeExample(t *testing.T) example {
	dir := repoPath(t, "examples/producer-node")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed: run make test-deps (it installs Debian's nodejs and runs npm ci in examples/producer-node)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "pg", "package.json")); err != nil {
		t.Fatalf("the pg package is not installed in examples/producer-node: run make test-deps (npm ci there)")
	}
	return example{name: "node", command: func(t *testing.T, args ...string) *exec.Cmd {
		cmd := exec.Command("node", append([]string{"index.js"}, args...)...)
		cmd.Dir = dir
		return cmd
	}}
}

// pythonExample is `python3 producer.py` in examples/producer-python,
// with Debian's python3 and its psycopg.
func pythonExample(t *testing.T) example {
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import psycopg").CombinedOutput(); err != nil {
		t.Fatalf("psycopg is not installed for %s: run make test-deps (it installs Debian's python3-psycopg): %v %s", python, err, out)
	}
	dir := repoPath(t, "examples/producer-python")
	return example{name: "python", command: func(t *testing.T, args ...string) *exec.Cmd {
		cmd := exec.Command(python, append([]string{"producer.py"}, args...)...)
		cmd.Dir = dir
		return cmd
	}}
}

// goExample is `go run ./examples/producer-go` from the repository, for
// its first run; the runs after it use the binary go build makes of it,
// so that twenty at once do not each compile it.
func goExample(t *testing.T) example {
	repo := repoPath(t, ".")
	bin := filepath.Join(t.TempDir(), "producer-go")
	var once sync.Once
	first := true
	return example{name: "go", command: func(t *testing.T, args ...string) *exec.Cmd {
		if first {
			first = false
			cmd := exec.Command("go", append([]string{"run", "./examples/producer-go"}, args...)...)
			cmd.Dir = repo
			return cmd
		}
		once.Do(func() {
			build := exec.Command("go", "build", "-o", bin, "./examples/producer-go")
			build.Dir = repo
			out, err := build.CombinedOutput()
			require.NoError(t, err, "go build ./examples/producer-go: %s", out)
		})
		return exec.Command(bin, args...)
	}}
}

// TestTheProducerExamplesKeepBatonsContract runs each example as its user
// would, and proves the SQL producer's contract in Go, Node and Python: a
// commit gets its reply; a rolled-back transaction publishes nothing (the
// relay's stream never holds its message); a retry says existed and makes
// no second turn; twenty retries at once make one message and one outbox
// row; ids and content with quotes, semicolons, control characters and
// non-ASCII are stored exactly; every documented error raises its
// SQLSTATE and writes nothing.
func TestTheProducerExamplesKeepBatonsContract(t *testing.T) {
	s := startStack(t)
	for _, e := range []func(*testing.T) example{goExample, nodeExample, pythonExample} {
		ex := e(t)
		t.Run(ex.name, func(t *testing.T) {
			t.Parallel()
			producerContract(t, s, ex)
		})
	}
}

func producerContract(t *testing.T, s *stack, e example) {
	user := "alice-" + e.name
	s.customer(t, user)

	// A commit gets its reply.
	conv := e.ok(t, s, "", "start", user, "welcome", "Welcome")
	require.False(t, conv.Existed)
	sent := e.ok(t, s, "", "send", user, "welcome", "m1", "hello")
	require.False(t, sent.Existed, "a new message")
	require.Equal(t, "echo: hello", s.reply(t, sent.MessageKey), "the worker answers the committed message")
	again := e.ok(t, s, "", "start", user, "welcome", "Welcome")
	require.Equal(t, answer{ConversationKey: conv.ConversationKey, Existed: true}, again, "starting it again finds the same conversation")

	// A retry says existed and makes no second turn.
	retry := e.ok(t, s, "", "send", user, "welcome", "m1", "hello")
	require.Equal(t, answer{MessageKey: sent.MessageKey, Existed: true}, retry, "a retry of the same message")
	n, last := s.published(t, conv.ConversationKey)
	require.Equal(t, uint64(1), n, "the stream holds one trigger for the conversation")
	require.Equal(t, sent.MessageKey, last)
	turns, replies := s.turns(t, sent.MessageKey)
	require.Equal(t, [2]int{1, 1}, [2]int{turns, replies}, "one turn and one reply for the message and its retry")

	// Twenty retries at once make one message, one outbox row, one turn.
	e.ok(t, s, "", "start", user, "burst")
	args := []string{"send", user, "burst", "twenty", "all at once"}
	type running struct {
		cmd            *exec.Cmd
		stdout, stderr *bytes.Buffer
	}
	var all []running
	for range 20 {
		cmd, stdout, stderr := e.start(t, s, "", args...)
		all = append(all, running{cmd, stdout, stderr})
	}
	keys := map[string]bool{}
	var stored, existed int
	for _, p := range all {
		r, err := wait(p.cmd, p.stdout, p.stderr)
		require.NoError(t, err)
		a, err := e.parse(r, args)
		require.NoError(t, err)
		keys[a.MessageKey] = true
		if a.Existed {
			existed++
		} else {
			stored++
		}
	}
	require.Equal(t, [2]int{1, 19}, [2]int{stored, existed}, "one of twenty calls stores the message, nineteen find it")
	require.Len(t, keys, 1, "all twenty name the same message")
	for key := range keys {
		require.Equal(t, "echo: all at once", s.reply(t, key))
		turns, _ := s.turns(t, key)
		require.Equal(t, 1, turns, "one turn for the twenty calls")
	}
	require.Equal(t, "users 1, other users 0, conversations 2, messages 4, outbox rows 2, support requests 2", s.rows(t, user),
		"the twenty calls stored one message, one outbox row and one support request, and got one reply")

	// A rolled-back transaction publishes nothing: a request from someone
	// who is not a customer is refused by the shop's own table after the
	// message was written, and the transaction rolls back.
	mallory := "mallory-" + e.name
	refund := e.ok(t, s, "", "start", mallory, "refund")
	stderr := e.fail(t, s, "", "send", mallory, "refund", "r1", "refund me")
	require.Contains(t, stderr, "23503", "the shop's foreign key refuses the request")
	require.Equal(t, "users 1, other users 0, conversations 1, messages 0, outbox rows 0, support requests 0", s.rows(t, mallory))
	// The next commit of the conversation is the first thing the stream
	// holds for it: the relay publishes in commit order, so a trigger of
	// the rolled-back message would have come before it.
	s.customer(t, mallory)
	after := e.ok(t, s, "", "send", mallory, "refund", "r2", "after the rollback")
	s.Eventually(30*time.Second, func() bool {
		_, last := s.published(t, refund.ConversationKey)
		return last == after.MessageKey
	}, "the relay publishes the committed message")
	n, _ = s.published(t, refund.ConversationKey)
	require.Equal(t, uint64(1), n, "the stream never saw the rolled-back message")
	require.Equal(t, "echo: after the rollback", s.reply(t, after.MessageKey))

	// Ids and content with quotes, semicolons, control characters and
	// non-ASCII are stored exactly.
	odd := struct{ user, conversation, title, message, content string }{
		user:         `o'brien "the"; DROP TABLE users; -- ü 漢 ` + e.name,
		conversation: `it's "q"; DELETE FROM messages; -- 会话 ü`,
		title:        `"Title"; ' -- ü`,
		message:      `m'1"; --ö`,
		content:      "line 1\nline 2\t'tab'\r\n\"dq\"; DROP TABLE messages; --\x01\x07\x1b[31m red\u00a0😀 ünï 漢字 \\N",
	}
	s.customer(t, odd.user)
	e.ok(t, s, "", "start", odd.user, odd.conversation, odd.title)
	oddSent := e.ok(t, s, "", "send", odd.user, odd.conversation, odd.message, odd.content)
	var got struct{ user, conversation, title, message, content string }
	require.NoError(t, s.DB.Pool.QueryRow(context.Background(), `
		SELECT u.name, c.public_id, c.title, m.public_id, m.content
		FROM messages m JOIN conversations c ON c.id = m.conversation_id JOIN users u ON u.id = m.owner_id
		WHERE m.id = $1`, oddSent.MessageKey).Scan(&got.user, &got.conversation, &got.title, &got.message, &got.content))
	require.Equal(t, odd, got, "what the example sent is stored exactly")
	require.Equal(t, "echo: "+odd.content, s.reply(t, oddSent.MessageKey))

	// Every documented error raises its SQLSTATE and writes nothing.
	for _, tc := range []struct {
		code, what, stdin string
		args              []string
	}{
		{"PB001", "a user id with a control character", "", []string{"start", "bad\x01user", "welcome"}},
		{"PB002", "a conversation id that starts with a space", "", []string{"send", user, " welcome", "e2", "x"}},
		{"PB003", "a message id with a newline", "", []string{"send", user, "welcome", "e\n3", "x"}},
		{"PB004", "empty content", "", []string{"send", user, "welcome", "e4", ""}},
		{"PB005", "content over 1 MiB", strings.Repeat("x", 1<<20+1), []string{"send", user, "welcome", "e5", "-"}},
		{"PB006", "a title over 500 characters", "", []string{"start", user, "long", strings.Repeat("t", 501)}},
		{"PB010", "a conversation the user does not have", "", []string{"send", user, "never-started", "e6", "x"}},
		{"PB011", "a message id used for other content", "", []string{"send", user, "welcome", "m1", "other"}},
		{"PB011", "a message id used in another conversation", "", []string{"send", user, "burst", "m1", "hello"}},
	} {
		others := []string{"bad\x01user"}
		before := s.rows(t, user, others...)
		stderr := e.fail(t, s, tc.stdin, tc.args...)
		require.True(t, strings.HasPrefix(stderr, tc.code+": "), "%s: want SQLSTATE %s first on stderr, got %q", tc.what, tc.code, stderr)
		require.Equal(t, before, s.rows(t, user, others...), "%s writes nothing", tc.what)
	}
}
