// Package guides_test runs the commands of the guides in this folder
// against a real PostgreSQL, relay, worker and API, as a reader runs them,
// so that a guide cannot drift from what works.
package guides_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/outboxtest"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// shellBlocks returns the lines of the ```sh blocks of a Markdown page that
// come before the heading stop.
func shellBlocks(t *testing.T, page, stop string) []string {
	t.Helper()
	f, err := os.Open(page)
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
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
	require.NoError(t, sc.Err())
	t.Fatalf("%s has no heading %q", page, stop)
	return nil
}

// provided are the lines of the guide that stand for what the test gives
// the script itself: baton dev and its files, the node modules that make
// test-deps installed, the dev token and the API's address.
var provided = []*regexp.Regexp{
	regexp.MustCompile(`^make dev$`),
	regexp.MustCompile(`^source \.baton/dev\.env$`),
	regexp.MustCompile(`^npm ci --prefix examples/producer-node$`),
	regexp.MustCompile(`^TOKEN=\$\(cat \.baton/dev-token\)$`),
	regexp.MustCompile(`^API=http://127\.0\.0\.1:8080$`),
}

// TestTheProducingGuideRunsAsWritten runs the shell commands of
// docs/guides/producing.md before "## In production", in one bash script
// from the repository, against a database with a relay, a worker and the
// API, where baton dev's user dev has a token. Only the lines that stand
// for baton dev (provided) are left out: the test gives the script
// BATON_DATABASE_URL, TOKEN and API instead. Every command must succeed,
// the retry and the refusals print what the guide says, and each message
// the guide sends gets its reply.
func TestTheProducingGuideRunsAsWritten(t *testing.T) {
	ctx := context.Background()
	b := outboxtest.Setup(t)
	b.RelayStreaming()
	w, err := consumer.New(consumer.Config{Stream: b.Stream, Agent: consumer.Echo{}, Debounce: consumer.NoDebounce}, b.DB.Pool, b.JS)
	require.NoError(t, err)
	outboxtest.RunInBackground(t, "worker", w.Run)
	token, _, err := schema.CreateToken(ctx, b.DB.Pool, "dev")
	require.NoError(t, err)
	s, err := api.New(api.Config{}, b.DB.Pool, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	// The guide's roles belong to the whole server.
	t.Cleanup(func() {
		_, _ = b.DB.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS shop CASCADE`)
		_, _ = b.DB.Pool.Exec(context.Background(), `DROP OWNED BY shop, baton_producer`)
		_, _ = b.DB.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS shop, baton_producer`)
	})

	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for _, line := range shellBlocks(t, "producing.md", "## In production") {
		if !slices.ContainsFunc(provided, func(re *regexp.Regexp) bool { return re.MatchString(line) }) {
			script.WriteString(line + "\n")
		}
	}
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "BATON_DATABASE_URL="+b.DB.URL, "TOKEN="+token, "API="+srv.URL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "the guide's commands must all succeed\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", script.String(), stdout.String(), stderr.String())

	out := stdout.String() + stderr.String()
	for _, want := range []string{
		`"existed":true`,
		`PB011: message id "msg-1" was already used for different content: use a new id for a new message`,
		`23503: insert or update on table "support_requests" violates foreign key constraint "support_requests_customer_fkey"`,
		"exit code 1",
	} {
		require.Contains(t, out, want, "the guide says the commands print this")
	}

	// Every message the guide sends is answered, as the API shows it. A
	// turn may answer two messages at once, when the second was stored
	// before the worker took the first: its reply has a line for each.
	sent := []string{"Where is my order?", "Can I change the address?", "Thanks!", "Hello from psql"}
	var messages []schema.Message
	b.Eventually(60*time.Second, func() bool {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/conversations/support/messages", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct{ Messages []schema.Message }
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
			return false
		}
		messages = body.Messages
		done := 0
		for _, m := range messages {
			if m.Role == schema.RoleUser && m.Status != nil && *m.Status == "done" {
				done++
			}
		}
		return done == len(sent)
	}, "the %d messages the guide sends are answered", len(sent))
	var asked, answered []string
	for _, m := range messages {
		switch m.Role {
		case schema.RoleUser:
			asked = append(asked, m.Content)
		case schema.RoleAssistant:
			answered = append(answered, strings.Split(m.Content, "\n")...)
		}
	}
	require.Equal(t, sent, asked, "dev's conversation support holds the guide's messages, in order")
	want := make([]string, len(sent))
	for i, text := range sent {
		want[i] = "echo: " + text
	}
	require.Equal(t, want, answered, "each message is answered once, in order")
	require.Equal(t, 0, b.Count(`
		SELECT count(*) FROM messages m JOIN users u ON u.id = m.owner_id WHERE u.name = 'mallory'`),
		"mallory's rolled-back message was never stored")
}

// referenceErrors reads the table of errors of docs/reference/sql-producer.md:
// each SQLSTATE with the messages it lists, as patterns in which <...>
// stands for any text.
func referenceErrors(t *testing.T) map[string][]*regexp.Regexp {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "reference", "sql-producer.md"))
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `(PB\\d{3})` \\| [^|]+ \\| (.+) \\|$")
	span := regexp.MustCompile("`([^`]+)`")
	out := map[string][]*regexp.Regexp{}
	for _, m := range row.FindAllStringSubmatch(string(page), -1) {
		for _, s := range span.FindAllStringSubmatch(m[2], -1) {
			text := strings.ReplaceAll(s[1], `\|`, "|")
			if strings.HasPrefix(text, "PB") || !strings.Contains(text, " ") {
				continue // a reference to another row, not a message
			}
			pattern := regexp.QuoteMeta(text)
			pattern = regexp.MustCompile(`<[a-z]+>`).ReplaceAllString(pattern, ".+")
			out[m[1]] = append(out[m[1]], regexp.MustCompile("^"+pattern+"$"))
		}
	}
	// PB003's row says: the messages of PB002, with "message id".
	for _, re := range out["PB002"] {
		out["PB003"] = append(out["PB003"], regexp.MustCompile(strings.Replace(re.String(), "conversation id", "message id", 1)))
	}
	return out
}

// TestTheSQLProducerReferenceListsEveryErrorAsRaised raises every error of
// the SQL producer and finds its SQLSTATE and its message in the
// reference's table; and the table lists no SQLSTATE that the migration
// does not raise.
func TestTheSQLProducerReferenceListsEveryErrorAsRaised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	documented := referenceErrors(t)
	_, err := db.Pool.Exec(ctx, `SELECT * FROM baton_create_conversation('alice', 'c1', ''); SELECT * FROM baton_create_conversation('alice', 'c2', '');
		SELECT * FROM baton_send_message('alice', 'c1', 'm1', 'hello');
		SELECT * FROM baton_create_conversation('alice', 'one-at-a-time', '', 'reject'); SELECT * FROM baton_send_message('alice', 'one-at-a-time', 'm3', 'first');
		ALTER TABLE users ADD CONSTRAINT users_name_short CHECK (length(name) <= 20) NOT VALID`)
	require.NoError(t, err)

	raised := map[string]bool{}
	for _, call := range []string{
		`SELECT * FROM baton_send_message('', 'c1', 'm2', 'x')`,
		`SELECT * FROM baton_create_conversation(repeat('u', 1001), 'c1')`,
		`SELECT * FROM baton_create_conversation(E'a\nb', 'c1')`,
		`SELECT * FROM baton_create_conversation(repeat('u', 21), 'c1')`,
		`SELECT * FROM baton_create_conversation('alice', '')`,
		`SELECT * FROM baton_create_conversation('alice', repeat('c', 201))`,
		`SELECT * FROM baton_create_conversation('alice', E'c\t1')`,
		`SELECT * FROM baton_create_conversation('alice', ' c1')`,
		`SELECT * FROM baton_create_conversation('alice', '..')`,
		`SELECT * FROM baton_send_message('alice', 'c1', 'reply_1', 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', '', 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', repeat('m', 201), 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', E'm\u00851', 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', E'm1\u3000', 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', 'm2', '')`,
		`SELECT * FROM baton_send_message('alice', 'c1', 'm2', repeat('x', 1048577))`,
		`SELECT * FROM baton_create_conversation('alice', 'c3', repeat('t', 501))`,
		`SELECT * FROM baton_send_message('alice', 'nope', 'm2', 'x')`,
		`SELECT * FROM baton_send_message('alice', 'c1', 'm1', 'bye')`,
		`SELECT * FROM baton_send_message('alice', 'c2', 'm1', 'hello')`,
		`SELECT * FROM baton_create_conversation('alice', 'c4', '', 'shout')`,
		`SELECT * FROM baton_send_message('alice', 'one-at-a-time', 'm4', 'second')`,
	} {
		_, err := db.Pool.Exec(ctx, call)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s must fail, got %v", call, err)
		raised[pgErr.Code] = true
		require.True(t, slices.ContainsFunc(documented[pgErr.Code], func(re *regexp.Regexp) bool { return re.MatchString(pgErr.Message) }),
			"%s raised %s %q, which the reference's table of errors does not list", call, pgErr.Code, pgErr.Message)
	}

	// The producer's migrations: its functions, and what later ones added
	// (double texting, the rules of ids).
	var migrations strings.Builder
	for _, name := range []string{"00015_producer.sql", "00023_double_texting.sql", "00024_id_rules.sql"} {
		migration, err := os.ReadFile(filepath.Join("..", "..", "migrations", name))
		require.NoError(t, err)
		migrations.Write(migration)
	}
	for code := range documented {
		require.Contains(t, migrations.String(), "'"+code+"'", "the reference lists %s, which the migrations never raise", code)
		require.True(t, raised[code], "the reference lists %s: raise it here too", code)
	}
	for _, code := range []string{schema.SQLStateBadUserID, schema.SQLStateBadConversationID, schema.SQLStateBadMessageID, schema.SQLStateEmptyContent,
		schema.SQLStateContentTooLarge, schema.SQLStateBadTitle, schema.SQLStateBadDoubleTexting, schema.SQLStateReservedMessageID,
		schema.SQLStateUnknownConversation, schema.SQLStateConflict, schema.SQLStateTurnRunning} {
		require.Contains(t, documented, code, "the reference lists every SQLSTATE of package schema")
	}
}
