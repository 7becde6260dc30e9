package migrations_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

// TestEveryTableSequenceAndFunctionHasAGrantDecision: once every
// migration ran, each table, sequence and function of the schema has a row
// in baton_grants (what each component's role may do with it, or NONE: the
// migrator alone). A migration that adds one without deciding who may use
// it fails here; deployed, a table would be out of every component's
// reach, or be granted by hand beyond what the code uses, and a function
// would be executable by nobody but its owner.
func TestEveryTableSequenceAndFunctionHasAGrantDecision(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	rows, err := db.Pool.Query(context.Background(), `
		SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'table ' END || c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S')
		  AND NOT EXISTS (SELECT FROM baton_grants g WHERE g.object = c.relname)
		UNION ALL
		SELECT 'function ' || p.proname FROM pg_proc p
		WHERE p.pronamespace = current_schema()::regnamespace
		  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
		  AND NOT EXISTS (SELECT FROM baton_grants g WHERE g.object = p.proname)
		ORDER BY 1`)
	require.NoError(t, err)
	undecided, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, undecided, "no grant decision for %s: in the migration that makes it, add its rows to baton_grants "+
		"(see migrations/00007_grants.sql and 00015_producer.sql), e.g. INSERT INTO baton_grants (object, role, privilege, columns, reason) "+
		"VALUES ('<name>', 'baton_worker', 'SELECT', NULL, '<the code that reads it>'), EXECUTE for a function, or privilege NONE "+
		"when only the migrator uses it; then SELECT baton_apply_grants()", strings.Join(undecided, ", "))
}

// TestNoFunctionIsLeftToPublic: PostgreSQL lets every role execute a new
// function; once the migrations ran, no function of the schema is
// executable by PUBLIC, so only the roles baton_grants names may call one.
func TestNoFunctionIsLeftToPublic(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	rows, err := db.Pool.Query(context.Background(), `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = current_schema()::regnamespace
		  AND EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a WHERE a.grantee = 0)
		ORDER BY 1`)
	require.NoError(t, err)
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, public, "functions any role may execute: baton_apply_grants() must revoke PUBLIC's EXECUTE on every function of the schema")
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND proname LIKE 'baton\_%'`).Scan(&n))
	require.GreaterOrEqual(t, n, 2, "the producer functions exist")
}

// TestEveryGrantDecisionNamesWhatExists: each row of baton_grants names a
// table, sequence or function of the schema, columns it has, a privilege
// that kind of object takes, and a role that deploy/postgres/roles.sql makes: a
// decision that names nothing grants nothing and would hide a missing
// grant.
func TestEveryGrantDecisionNamesWhatExists(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	sql, err := os.ReadFile("../deploy/postgres/roles.sql")
	require.NoError(t, err)
	made := map[string]bool{}
	for _, m := range regexp.MustCompile(`\('([a-z]+)', (?:true|false), '(?:NO)?REPLICATION'\)`).FindAllStringSubmatch(string(sql), -1) {
		made["baton_"+m[1]] = true
	}
	require.Len(t, made, 8, "the login roles of roles.sql")
	require.Contains(t, string(sql), "CREATE ROLE baton_producer", "roles.sql makes the group role baton_producer")
	made["baton_producer"] = true

	rows, err := db.Pool.Query(context.Background(), `
		SELECT g.object, g.role, g.privilege, coalesce(g.columns, '{}'),
		       coalesce(c.relkind::text, CASE WHEN EXISTS (SELECT FROM pg_proc p WHERE p.proname = g.object
		                                                   AND p.pronamespace = current_schema()::regnamespace) THEN 'f' END, ''),
		       coalesce((SELECT array_agg(col) FROM unnest(g.columns) col
		                 WHERE NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped)), '{}')
		FROM baton_grants g
		LEFT JOIN pg_class c ON c.relname = g.object AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
		ORDER BY g.object, g.role, g.privilege`)
	require.NoError(t, err)
	var problems []string
	n := 0
	for rows.Next() {
		var object, role, privilege, kind string
		var columns, missing []string
		require.NoError(t, rows.Scan(&object, &role, &privilege, &columns, &kind, &missing))
		n++
		what := fmt.Sprintf("%s %s for %s", privilege, object, role)
		switch {
		case kind == "":
			problems = append(problems, what+": no such table, sequence or function")
		case kind == "f" && (privilege != "EXECUTE" && privilege != "NONE" || len(columns) > 0):
			problems = append(problems, what+": a function takes EXECUTE (or NONE), without columns")
		case kind != "f" && privilege == "EXECUTE":
			problems = append(problems, what+": only a function takes EXECUTE")
		case len(missing) > 0:
			problems = append(problems, fmt.Sprintf("%s: no such column %s", what, strings.Join(missing, ", ")))
		case kind == "S" && privilege != "USAGE" && privilege != "NONE":
			problems = append(problems, what+": a sequence takes USAGE (or NONE)")
		case kind != "S" && privilege == "USAGE":
			problems = append(problems, what+": a table takes SELECT, INSERT, UPDATE or DELETE (or NONE)")
		case len(columns) > 0 && privilege != "SELECT" && privilege != "INSERT" && privilege != "UPDATE":
			problems = append(problems, what+": only SELECT, INSERT and UPDATE take columns")
		case !made[role]:
			problems = append(problems, what+": deploy/postgres/roles.sql makes no role "+role)
		}
	}
	require.NoError(t, rows.Err())
	require.NotZero(t, n)
	require.Empty(t, problems, "rows of baton_grants that name nothing: fix them in a new migration")
}
