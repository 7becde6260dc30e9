package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
)

// migrate runs `baton migrate` as baton_migrator, as the migrate unit and
// the migration Job do.
func (d *deployment) migrate(t *testing.T) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := cli.Run(context.Background(), []string{"--log-format", "json", "migrate", "--database-url", d.url("migrator")}, &stdout, &stderr)
	require.NoError(t, err, "baton migrate as baton_migrator: %s", stderr.String())
	require.NotContains(t, stdout.String()+stderr.String(), passwords["migrator"], "baton migrate printed its password")
}

// privileges is every privilege of the database that roles.sql and the
// grants decide: the roles' attributes and memberships, the database's,
// the schema's and the tables', columns', sequences' and functions' access
// lists, and who may emit logical decoding messages.
func privileges(t *testing.T, db *pgxpool.Pool) string {
	t.Helper()
	var out string
	err := db.QueryRow(context.Background(), `
		SELECT concat_ws(E'\n',
		  (SELECT string_agg(format('%s login=%s super=%s replication=%s createdb=%s createrole=%s bypassrls=%s member_of=%s',
		            r.rolname, r.rolcanlogin, r.rolsuper, r.rolreplication, r.rolcreatedb, r.rolcreaterole, r.rolbypassrls,
		            (SELECT array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid)),
		          E'\n' ORDER BY r.rolname)
		     FROM pg_roles r WHERE r.rolname LIKE 'baton\_%'),
		  (SELECT 'database ' || datacl::text FROM pg_database WHERE datname = current_database()),
		  (SELECT 'schema ' || nspacl::text FROM pg_namespace WHERE nspname = 'public'),
		  (SELECT string_agg(c.relname || ' ' || coalesce(c.relacl::text, '') || ' ' ||
		            coalesce((SELECT string_agg(a.attname || '=' || a.attacl::text, ' ' ORDER BY a.attnum)
		                      FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL), ''),
		          E'\n' ORDER BY c.relname)
		     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		     WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S')),
		  (SELECT string_agg(oid::regprocedure::text || ' ' || coalesce(proacl::text, 'default'), E'\n' ORDER BY oid)
		     FROM pg_proc WHERE proname = 'pg_logical_emit_message'),
		  (SELECT string_agg(oid::regprocedure::text || ' ' || coalesce(proacl::text, 'default'), E'\n' ORDER BY proname, oid)
		     FROM pg_proc WHERE pronamespace = 'public'::regnamespace))`).Scan(&out)
	require.NoError(t, err)
	return out
}

// TestRolesSQLIsSafeToRunAgainAndNeverPrintsAPassword: roles.sql makes the
// roles, the database and its grants; run again, with the passwords from
// the environment instead of -v, it changes nothing; without a required
// password, or with a short one, it stops and says which and how to give
// it. No run prints a password (rolesSQL checks every output).
func TestRolesSQLIsSafeToRunAgainAndNeverPrintsAPassword(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	su := d.superuser(t)
	before := privileges(t, su)
	for _, role := range []string{"baton_migrator", "baton_api", "baton_worker", "baton_relay", "baton_group", "baton_status", "baton_admin", "baton_console"} {
		require.Contains(t, before, role+" login=t super=f", "roles.sql makes %s, a login role and no superuser", role)
	}
	require.Contains(t, before, "baton_producer login=f super=f replication=f createdb=f createrole=f bypassrls=f member_of=\n",
		"roles.sql makes baton_producer, a group role that is no login and belongs to no other role")
	require.Contains(t, before, "baton_send_message(text,text,text,text,jsonb) {baton_migrator=X/baton_migrator,baton_producer=X/baton_migrator}",
		"baton_producer, and nobody else but the owner, may execute baton_send_message")
	require.Contains(t, before, "baton_relay login=t super=f replication=t createdb=f createrole=f bypassrls=f member_of=\n")
	require.Contains(t, before, "baton_status login=t super=f replication=f createdb=f createrole=f bypassrls=f member_of={pg_read_all_stats}")
	require.Contains(t, before, "baton_console login=t super=f replication=f createdb=f createrole=f bypassrls=f member_of={pg_read_all_stats}")
	require.Contains(t, before, "baton_api login=t super=f replication=f")

	out, err := d.rolesSQL(t, nil, components)
	require.NoError(t, err, "roles.sql with the passwords in the environment: %s", out)
	require.Contains(t, out, "the roles are ready, with")
	require.Equal(t, before, privileges(t, su), "a second run of roles.sql changes no privilege")

	// The migrator's grants, applied again by `baton migrate`, agree.
	d.migrate(t)
	require.Equal(t, before, privileges(t, su), "baton migrate applies the same grants as roles.sql")

	out, err = d.rolesSQL(t, []string{"migrator", "api", "worker", "group"}, nil)
	require.Error(t, err, "roles.sql without the relay's password must fail: %s", out)
	require.Contains(t, out, "no password for baton_relay: give -v relay_password=... or set BATON_PG_RELAY_PASSWORD")

	saved := passwords["relay"]
	passwords["relay"] = "too-short"
	out, err = d.rolesSQL(t, components, nil)
	passwords["relay"] = saved
	require.Error(t, err)
	require.Contains(t, out, "the password for baton_relay is shorter than 16 characters")
	require.Equal(t, before, privileges(t, su), "a failed run of roles.sql changes nothing")
}

// TestMigrateAsTheMigratorFromAnEmptyDatabase: `baton migrate` as
// baton_migrator makes the schema in a database that roles.sql just made:
// the migrator owns every table, sequence and the publication, and no
// other role owns anything or may create anything.
func TestMigrateAsTheMigratorFromAnEmptyDatabase(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	su := d.superuser(t)
	rows, err := su.Query(ctx, `
		SELECT c.relname || ' ' || pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S') AND pg_get_userbyid(c.relowner) <> 'baton_migrator'
		UNION ALL
		SELECT 'publication ' || pubname || ' ' || pg_get_userbyid(pubowner) FROM pg_publication
		WHERE pg_get_userbyid(pubowner) <> 'baton_migrator'`)
	require.NoError(t, err)
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, others, "baton_migrator owns the whole schema")
	var tables int
	require.NoError(t, su.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = 'baton_migrator'`).Scan(&tables))
	require.Greater(t, tables, 10)
	var publication bool
	require.NoError(t, su.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = 'baton_outbox')`).Scan(&publication))
	require.True(t, publication, "migration 00008 made the publication, as the migrator")
}

// TestEachRoleIsRefusedWhatItsComponentDoesNotDo tries, as each role,
// something its code never does, and expects PostgreSQL to refuse it for
// lack of privilege.
func TestEachRoleIsRefusedWhatItsComponentDoesNotDo(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	for _, tc := range []struct {
		component, what, sql string
	}{
		{"api", "create a table", `CREATE TABLE intruder (id int)`},
		{"api", "create a temporary table", `CREATE TEMP TABLE intruder (id int)`},
		{"api", "create a schema", `CREATE SCHEMA intruder`},
		{"api", "insert a run", `INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, lease_expires_at) VALUES ('r', 'c', 't', '{}', 'w', now())`},
		{"api", "update runs", `UPDATE agent_runs SET status = 'failed'`},
		{"api", "read runs' errors", `SELECT error FROM agent_runs`},
		{"api", "read operations' errors", `SELECT error FROM operations`},
		{"api", "change a reply", `UPDATE messages SET content = 'x'`},
		{"api", "take a conversation's lease", `UPDATE conversations SET run_id = 'r', lease_expires_at = now()`},
		{"api", "write a reply's run", `INSERT INTO messages (id, conversation_id, role, content, run_id) VALUES ('x', 'c', 'assistant', 'x', 'r')`},
		{"api", "make a replication slot", `SELECT pg_create_logical_replication_slot('intruder', 'pgoutput')`},
		{"api", "read the audit log", `SELECT count(*) FROM audit_events`},
		{"api", "change the grant decisions", `UPDATE baton_grants SET privilege = 'SELECT'`},
		{"api", "send a message as any user through the SQL producer", `SELECT * FROM baton_send_message('alice', 'c', 'm', 'x')`},
		{"api", "create a conversation for any user through the SQL producer", `SELECT * FROM baton_create_conversation('alice', 'c', 'x')`},
		{"api", "find or make a user by name", `SELECT baton_producer_user('alice', true)`},
		{"worker", "store a user message", `SELECT * FROM baton_send_message_for_owner(1, 'c', 'm', 'x', NULL)`},
		{"worker", "create a conversation", `SELECT * FROM baton_create_conversation_for_owner(1, 'c', 'x')`},
		{"relay", "store a user message", `SELECT * FROM baton_send_message_for_owner(1, 'c', 'm', 'x', NULL)`},
		{"worker", "read tokens", `SELECT token_hash FROM api_tokens`},
		{"worker", "change users", `UPDATE users SET name = 'x'`},
		{"worker", "read more of users than their names", `SELECT created_at FROM users`},
		{"worker", "delete a conversation", `DELETE FROM conversations`},
		{"worker", "create a table", `CREATE TABLE intruder (id int)`},
		{"relay", "insert a message", `INSERT INTO messages (id, conversation_id, role, content) VALUES ('x', 'c', 'user', 'x')`},
		{"relay", "read messages", `SELECT content FROM messages`},
		{"relay", "change an outbox row's status", `UPDATE agent_outbox SET status = 'done'`},
		{"relay", "insert an outbox row", `INSERT INTO agent_outbox (conversation_id, message_id) VALUES ('c', 'm')`},
		{"relay", "create a publication", `CREATE PUBLICATION intruder FOR ALL TABLES`},
		{"group", "insert a message", `INSERT INTO messages (id, conversation_id, role, content) VALUES ('x', 'c', 'user', 'x')`},
		{"group", "update messages", `UPDATE messages SET content = 'x'`},
		{"group", "read messages", `SELECT content FROM messages`},
		{"group", "emit an announcement", `SELECT pg_logical_emit_message(true, 'baton.announce', '{}'::bytea)`},
		{"group", "read the audit log it appends to", `SELECT count(*) FROM audit_events`},
		{"group", "write an outbox row", `UPDATE agent_outbox SET announced_at = now()`},
		{"status", "read message content", `SELECT content FROM messages`},
		{"status", "read conversation titles", `SELECT title FROM conversations`},
		{"status", "read dead letters' payloads", `SELECT payload FROM group_dead_letters`},
		{"status", "emit an announcement", `SELECT pg_logical_emit_message(true, 'baton.announce', '{}'::bytea)`},
		{"status", "update the outbox", `UPDATE agent_outbox SET announced_at = now()`},
		{"admin", "read messages", `SELECT content FROM messages`},
		{"admin", "read conversations", `SELECT count(*) FROM conversations`},
		{"console", "write a message", `INSERT INTO messages (id, conversation_id, role, content) VALUES ('x', 'c', 'user', 'x')`},
		{"console", "change a message", `UPDATE messages SET content = 'x'`},
		{"console", "send a message through the producer", `SELECT * FROM baton_send_message_for_owner(1, 'c', 'm', 'x', NULL)`},
		{"console", "insert an outbox row", `INSERT INTO agent_outbox (conversation_id, message_id) VALUES ('c', 'm')`},
		{"console", "take a conversation's lease", `UPDATE conversations SET run_id = 'r', lease_expires_at = now()`},
		{"console", "delete a conversation", `DELETE FROM conversations`},
		{"console", "record a run", `INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, lease_expires_at) VALUES ('r', 'c', 't', '{}', 'w', now())`},
		{"console", "change a call's arguments", `UPDATE operations SET arguments = '{}'`},
		{"console", "journal a step", `INSERT INTO agent_steps (conversation_id, turn_id, epoch, step, run_id, answer) VALUES ('c', 't', 0, 0, 'r', '{}')`},
		{"console", "decide an approval", `UPDATE approvals SET status = 'approved'`},
		{"console", "create a token", `INSERT INTO api_tokens (user_id, token_hash) VALUES (1, 'x')`},
		{"console", "revoke a token", `UPDATE api_tokens SET revoked_at = now()`},
		{"console", "make a user", `INSERT INTO users (name) VALUES ('x')`},
		{"console", "change or delete the record of operators' actions", `UPDATE operator_actions SET operator = 'x'`},
		{"console", "delete the record of operators' actions", `DELETE FROM operator_actions`},
		{"console", "park a dead letter", `INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, payload, attempts, error) VALUES ('g', 'e', 's', 1, 's', '', 1, 'x')`},
		{"console", "read the audit log", `SELECT count(*) FROM audit_events`},
		{"console", "change the grant decisions", `UPDATE baton_grants SET privilege = 'SELECT'`},
		{"console", "create a table", `CREATE TABLE intruder (id int)`},
		{"migrator", "make a replication slot", `SELECT pg_create_logical_replication_slot('intruder', 'pgoutput')`},
	} {
		pool := d.pool(t, tc.component)
		_, err := pool.Exec(ctx, tc.sql)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "baton_%s must not %s, but it could (error: %v)", tc.component, tc.what, err)
		require.Equal(t, "42501", pgErr.Code, "baton_%s %s: want insufficient_privilege, got %s %s", tc.component, tc.what, pgErr.Code, pgErr.Message)
	}
}

// TestRolesConnectOnlyOverTLSWithTheirPasswordToTheirDatabase: the
// shipped pg_hba.conf admits each role over TLS with its SCRAM password,
// and refuses a connection without TLS, a wrong password, another
// database, and a physical replication connection of the relay (which
// would let it copy every file of the server).
func TestRolesConnectOnlyOverTLSWithTheirPasswordToTheirDatabase(t *testing.T) {
	d := newDatabase(t)
	ctx := context.Background()
	for _, c := range components {
		conn, err := pgconn.Connect(ctx, d.url(c))
		require.NoError(t, err, "baton_%s over TLS with its password", c)
		require.NoError(t, conn.Close(ctx))
	}
	refused := func(what, url string) {
		t.Helper()
		conn, err := pgconn.Connect(ctx, url)
		if err == nil {
			_ = conn.Close(ctx)
		}
		require.Error(t, err, "%s must be refused", what)
		require.NotContains(t, err.Error(), passwords["api"])
	}
	noTLS := strings.Replace(d.url("api"), "sslmode=verify-full", "sslmode=disable", 1)
	require.NotEqual(t, d.url("api"), noTLS)
	refused("baton_api without TLS", noTLS)
	refused("baton_api with a wrong password", d.server.TLSURL("baton_api", "wrong-password-0123456789", d.name))
	refused("baton_api to the postgres database", d.server.TLSURL("baton_api", passwords["api"], "postgres"))
	refused("a physical replication connection of baton_relay", d.url("relay")+"&replication=true")

	// The relay's logical replication connection is admitted.
	conn, err := pgconn.Connect(ctx, d.url("relay")+"&replication=database")
	require.NoError(t, err, "baton_relay's logical replication connection")
	require.NoError(t, conn.Close(ctx))
}
