package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// producerFunctions are the SQL producer's public functions, the only
// things of Baton's that baton_producer may use.
var producerFunctions = []string{"baton_create_conversation(text,text,text,text)", "baton_send_message(text,text,text,text)"}

// TestABackendInBatonProducerCallsTheProducerFunctionsAndNothingElse: a
// backend's own role, made a member of baton_producer as the guide says,
// connects over TLS through pg_hba.conf's +baton_producer line, writes a
// row of its own table and a message in one transaction, and is refused
// every table and sequence of Baton's and every other function of the
// schema, whatever it tries; baton_producer itself holds no privilege on
// them but EXECUTE on the two functions.
func TestABackendInBatonProducerCallsTheProducerFunctionsAndNothingElse(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	su := d.superuser(t)

	// The backend's role and its own schema, as an operator makes them.
	role, password := "shop_"+d.name, randomPassword()
	_, err := su.Exec(ctx, `SELECT set_config('baton.test_password', $1, false)`, password)
	require.NoError(t, err)
	for _, sql := range []string{
		`DO $$ BEGIN EXECUTE format('CREATE ROLE %I LOGIN PASSWORD %L', 'shop_' || current_database(), current_setting('baton.test_password')); END $$`,
		`GRANT baton_producer TO ` + role,
		`CREATE SCHEMA shop AUTHORIZATION ` + role,
	} {
		_, err := su.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() {
		_, _ = su.Exec(context.Background(), `DROP SCHEMA shop CASCADE`)
		_, _ = su.Exec(context.Background(), `DROP ROLE `+role)
	})
	shop, err := pgxpool.New(ctx, d.server.TLSURL(role, password, d.name))
	require.NoError(t, err)
	t.Cleanup(shop.Close)

	// Its own row and the message, in one transaction.
	_, err = shop.Exec(ctx, `CREATE TABLE shop.orders (id text PRIMARY KEY, message_key text NOT NULL)`)
	require.NoError(t, err, "the backend makes a table in its own schema")
	var key string
	require.NoError(t, pgx.BeginFunc(ctx, shop, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT * FROM baton_create_conversation('carol', 'order-1', 'Order 1')`); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT message_key FROM baton_send_message('carol', 'order-1', 'order-1-placed', 'Where is my order?')`).Scan(&key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO shop.orders (id, message_key) VALUES ('1', $1)`, key)
		return err
	}), "a member of baton_producer produces in its own transaction")
	var stored string
	require.NoError(t, su.QueryRow(ctx, `
		SELECT m.content FROM messages m JOIN agent_outbox o ON o.message_id = m.id JOIN users u ON u.id = m.owner_id
		WHERE m.id = $1 AND u.name = 'carol'`, key).Scan(&stored))
	require.Equal(t, "Where is my order?", stored, "the message and its outbox row are stored for carol")

	// The conversation's double texting holds for the backend as for the
	// API, with nothing but EXECUTE on the two functions: one made to
	// reject refuses a second message while the first waits for its turn;
	// one made to interrupt asks its running turn to stop.
	_, err = shop.Exec(ctx, `SELECT * FROM baton_create_conversation('carol', 'order-2', 'Order 2', 'reject');
		SELECT * FROM baton_send_message('carol', 'order-2', 'order-2-placed', 'Hello?')`)
	require.NoError(t, err)
	_, err = shop.Exec(ctx, `SELECT * FROM baton_send_message('carol', 'order-2', 'order-2-again', 'Hello??')`)
	var refused *pgconn.PgError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, "PB012", refused.Code, refused.Message)
	_, err = shop.Exec(ctx, `SELECT * FROM baton_create_conversation('carol', 'order-3', 'Order 3', 'interrupt')`)
	require.NoError(t, err)
	_, err = su.Exec(ctx, `UPDATE conversations SET run_id = 'run-3', lease_expires_at = now() + interval '1 minute' WHERE public_id = 'order-3'`)
	require.NoError(t, err, "a worker's run holds the conversation")
	_, err = shop.Exec(ctx, `SELECT * FROM baton_send_message('carol', 'order-3', 'order-3-placed', 'Stop, I meant order 2')`)
	require.NoError(t, err)
	var stop, interrupted string
	require.NoError(t, su.QueryRow(ctx, `SELECT stop_run_id, interrupted_run_id FROM conversations WHERE public_id = 'order-3'`).Scan(&stop, &interrupted))
	require.Equal(t, []string{"run-3", "run-3"}, []string{stop, interrupted}, "the running turn is asked to stop, interrupted")

	// What baton_producer holds, by the catalog: EXECUTE on the two
	// functions, nothing on any table, column or sequence.
	rows, err := su.Query(ctx, `
		SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'table ' END || c.relname
		FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
		  AND CASE WHEN c.relkind = 'S'
		           THEN has_sequence_privilege('baton_producer', c.oid, 'USAGE, SELECT, UPDATE')
		           ELSE has_table_privilege('baton_producer', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
		                OR has_any_column_privilege('baton_producer', c.oid, 'SELECT, INSERT, UPDATE, REFERENCES') END
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'public'::regnamespace AND has_function_privilege('baton_producer', p.oid, 'EXECUTE')
		ORDER BY 1`)
	require.NoError(t, err)
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"function " + producerFunctions[0], "function " + producerFunctions[1]}, held,
		"baton_producer may execute the two producer functions and use nothing else of Baton's")

	// And by trying: every table read and written, every sequence
	// advanced, every other function called, as the backend's role.
	rows, err = su.Query(ctx, `
		SELECT format('SELECT FROM %I LIMIT 0', c.relname) FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
		UNION ALL
		SELECT format('DELETE FROM %I', c.relname) FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
		UNION ALL
		SELECT format('SELECT nextval(%L)', c.relname) FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
		UNION ALL
		SELECT format('SELECT %s(%s)', p.oid::regproc,
		              (SELECT coalesce(string_agg('NULL::' || format_type(a, NULL), ', '), '') FROM unnest(p.proargtypes) a))
		FROM pg_proc p
		WHERE p.pronamespace = 'public'::regnamespace AND NOT p.oid::regprocedure::text = ANY ($1)
		UNION ALL
		SELECT format('SELECT %s(true, ''baton.announce'', ''{}''::bytea)', 'pg_logical_emit_message')
		ORDER BY 1`, producerFunctions)
	require.NoError(t, err)
	attempts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Greater(t, len(attempts), 40, "every table, sequence and function of the schema is tried")
	for _, sql := range attempts {
		_, err := shop.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "a member of baton_producer must not run %s, but it could (error: %v)", sql, err)
		require.Equal(t, "42501", pgErr.Code, "%s: want insufficient_privilege, got %s %s", sql, pgErr.Code, pgErr.Message)
	}
}
