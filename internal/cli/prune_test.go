package cli_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/cli"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// oldTurns stores n answered turns whose rows and runs finished a day ago,
// the way the worker leaves them.
func oldTurns(t *testing.T, db *testenv.DB, n int) {
	t.Helper()
	ctx := context.Background()
	_, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	for i := range n {
		c, _, err := schema.CreateConversation(ctx, db.Pool, u.ID, fmt.Sprintf("c%d", i), "")
		require.NoError(t, err)
		var res schema.InsertResult
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: u.ID, ConversationID: c.ID, MessageID: fmt.Sprintf("m%d", i), Content: "hello"})
			return err
		}))
		run := fmt.Sprintf("run_old_%d", i)
		_, err = db.Pool.Exec(ctx, `
			WITH o AS (UPDATE agent_outbox SET status = 'done', attempts = 1, run_id = $2, processed_at = now() - interval '1 day' WHERE id = $1)
			INSERT INTO agent_runs (id, conversation_id, turn_id, outbox_ids, worker, status, started_at, lease_expires_at, finished_at)
			VALUES ($2, $3, 'turn', ARRAY[$1::bigint], 'w', 'finalized', now() - interval '1 day', now() - interval '1 day', now() - interval '1 day')`,
			res.OutboxID, run, c.Key)
		require.NoError(t, err)
	}
}

func TestPruneDryRunPrintsWhatItWouldDeletePerTableAndDeletesNothing(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	nats := testenv.StartNATS(t)
	oldTurns(t, db, 3)
	ctx := context.Background()
	_, js := nats.Connect(t)
	_, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{}.WithDefaults(), batonnats.ProvisionOptions{})
	require.NoError(t, err)
	count := func(table string) int { return testenv.Count(t, db.Pool, `SELECT count(*) FROM `+table) }
	args := []string{"prune", "--database-url", db.URL, "--nats-url", nats.URL, "--outbox-retention", "1h", "--run-retention", "1h"}

	out, stderr, code := run(t, append(args, "--dry-run")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "dry run: would delete (nothing was changed)")
	require.Regexp(t, `agent_outbox\s+3\s+done and failed outbox rows finished more than 1h0m0s ago`, out)
	require.Regexp(t, `agent_runs\s+3\s+`, out)
	require.Regexp(t, `operations\s+0\s+`, out)
	require.Regexp(t, `group_inbox\s+0\s+group inbox rows of events BATON_OUTBOX no longer holds`, out)
	require.Equal(t, 3, count("agent_outbox"), "a dry run deletes nothing")
	require.Equal(t, 3, count("agent_runs"))

	out, stderr, code = run(t, args...)
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasPrefix(out, "pruned\n"), out)
	require.Regexp(t, `agent_outbox\s+3\s+`, out)
	require.Zero(t, count("agent_outbox"))
	require.Zero(t, count("agent_runs"))
	require.Equal(t, 3, count("messages"), "messages are never pruned")

	_, stderr, code = run(t, "prune", "--database-url", db.URL, "--nats-url", nats.URL, "--outbox-retention=-1h")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--outbox-retention / BATON_OUTBOX_RETENTION -1h0m0s: must be positive")
}

func TestOnlyTheRelayThatHoldsTheSlotPrunes(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	nats := testenv.StartNATS(t)
	oldTurns(t, db, 2)
	slot := fmt.Sprintf("prune_%d", time.Now().UnixNano()%1e9)
	relay := func() (metrics string, stop func()) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = cli.Run(ctx, []string{"--log-format", "json", "relay", "--database-url", db.URL, "--nats-url", nats.URL, "--slot", slot,
				"--metrics-addr", addr, "--prune-every", "100ms", "--run-retention", "1h", "--outbox-retention", "1h"}, io.Discard, io.Discard)
		}()
		return "http://" + addr + "/metrics", func() { cancel(); <-done }
	}
	first, stopFirst := relay()
	defer stopFirst()
	waitMetric(t, first, "baton_relay_active", func(v float64) bool { return v == 1 }, "the first relay streams")
	second, stopSecond := relay()
	defer stopSecond()
	waitMetric(t, second, "baton_relay_active", func(v float64) bool { return v == 0 }, "the second relay stands by")

	// The active relay prunes, pass after pass; the standby none.
	waitMetric(t, first, `baton_prune_rows_total{table="agent_outbox"}`, func(v float64) bool { return v == 2 }, "the active relay pruned the outbox")
	waitMetric(t, first, `baton_prune_passes_total{result="caught_up"}`, func(v float64) bool { return v >= 5 }, "the active relay prunes again and again")
	waitMetric(t, second, `baton_prune_passes_total{result="caught_up"}`, func(v float64) bool { return v == 0 }, "a standby relay prunes nothing")
	waitMetric(t, second, `baton_prune_rows_total{table="agent_outbox"}`, func(v float64) bool { return v == 0 }, "a standby relay prunes nothing")
	var runs int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM agent_runs`).Scan(&runs))
	require.Zero(t, runs)
}

// waitMetric scrapes url until the series' value satisfies cond.
func waitMetric(t *testing.T, url, series string, cond func(float64) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	last := "not exported"
	for {
		if resp, err := http.Get(url); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, line := range strings.Split(string(body), "\n") {
				name, value, ok := strings.Cut(line, " ")
				if !ok || name != series {
					continue
				}
				last = value
				if v, err := strconv.ParseFloat(value, 64); err == nil && cond(v) {
					return
				}
			}
		}
		require.True(t, time.Now().Before(deadline), "%s: %s is %s after 60s at %s", what, series, last, url)
		time.Sleep(20 * time.Millisecond)
	}
}
