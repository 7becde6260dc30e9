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

// TestEveryTableAndSequenceHasAGrantDecision: once every migration ran,
// each table and sequence of the schema has a row in baton_grants (what
// each component's role may do with it, or NONE: the migrator alone). A
// migration that adds a table or a sequence without deciding who may use
// it fails here; deployed, its table would be out of every component's
// reach, or be granted by hand beyond what the code uses.
func TestEveryTableAndSequenceHasAGrantDecision(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	rows, err := db.Pool.Query(context.Background(), `
		SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'table ' END || c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S')
		  AND NOT EXISTS (SELECT FROM baton_grants g WHERE g.object = c.relname)
		ORDER BY c.relname`)
	require.NoError(t, err)
	undecided, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, undecided, "no grant decision for %s: in the migration that makes it, add its rows to baton_grants "+
		"(see migrations/00007_grants.sql), e.g. INSERT INTO baton_grants (object, role, privilege, columns, reason) "+
		"VALUES ('<name>', 'baton_worker', 'SELECT', NULL, '<the code that reads it>'), or privilege NONE when only the "+
		"migrator uses it; then SELECT baton_apply_grants()", strings.Join(undecided, ", "))
}

// TestEveryGrantDecisionNamesWhatExists: each row of baton_grants names a
// table or sequence of the schema, columns it has, a privilege that kind
// of object takes, and a role that deploy/postgres/roles.sql makes: a
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
	require.Len(t, made, 7, "the roles of roles.sql")

	rows, err := db.Pool.Query(context.Background(), `
		SELECT g.object, g.role, g.privilege, coalesce(g.columns, '{}'), coalesce(c.relkind::text, ''),
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
			problems = append(problems, what+": no such table or sequence")
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
