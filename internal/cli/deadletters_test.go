package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestGroupDeadLettersListRetryAndDiscardAsAnOperatorWould(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ctx := context.Background()
	// Two events the audit group parked (its database was away, say).
	for i := int64(1); i <= 2; i++ {
		body, err := json.Marshal(batonnats.Trigger{OutboxID: i, ConversationID: "c_1", MessageID: fmt.Sprintf("m_%d", i), CreatedAt: time.Now(), Reason: batonnats.ReasonInsert})
		require.NoError(t, err)
		published := time.Now().Add(-time.Minute)
		require.NoError(t, schema.Park(ctx, db.Pool, schema.DeadLetter{
			Group: "audit", EventID: fmt.Sprintf("outbox-%d", i), Stream: "BATON_OUTBOX", StreamSeq: uint64(i), Subject: "baton.outbox.0.YQ",
			OutboxID: &i, Headers: []byte(`{"Nats-Msg-Id":["outbox-` + fmt.Sprint(i) + `"]}`), Payload: body, Attempts: 5,
			Error: "append audit event: dial tcp: connect to postgres://audit:s3cret@db:5432 refused", PublishedAt: &published,
		}))
	}
	dead, err := schema.DeadLetters(ctx, db.Pool, "audit", false)
	require.NoError(t, err)
	require.Len(t, dead, 2)

	out, stderr, code := run(t, "group", "dead-letters", "list", "audit", "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "outbox-1")
	require.Contains(t, out, "outbox-2")
	require.Contains(t, out, "parked")
	require.NotContains(t, out, "s3cret", "a URL's password in an error is not shown")
	require.Contains(t, out, "postgres://redacted@db:5432")

	_, stderr, code = run(t, "group", "dead-letters", "retry", "audit", "--database-url", db.URL)
	require.Equal(t, 2, code, "retry needs ids or --all")
	require.Contains(t, stderr, "--all")

	out, stderr, code = run(t, "group", "dead-letters", "retry", "audit", fmt.Sprint(dead[0].ID), "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "applied; resolved")
	out, stderr, code = run(t, "group", "dead-letters", "discard", "audit", fmt.Sprint(dead[1].ID), "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "discarded")
	_, stderr, code = run(t, "group", "dead-letters", "discard", "audit", fmt.Sprint(dead[1].ID), "--database-url", db.URL)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "already resolved")

	var audited int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events`).Scan(&audited))
	require.Equal(t, 1, audited, "the retried event is in the audit log once; the discarded one is not")

	out, stderr, code = run(t, "group", "dead-letters", "list", "audit", "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "group audit has no unresolved dead letters")
	out, stderr, code = run(t, "group", "dead-letters", "list", "audit", "--all", "--json", "--database-url", db.URL)
	require.Equal(t, 0, code, stderr)
	var listed struct {
		DeadLetters []struct {
			EventID string `json:"event_id"`
			State   string `json:"state"`
		} `json:"dead_letters"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed.DeadLetters, 2, "nothing was deleted")
	states := map[string]string{}
	for _, d := range listed.DeadLetters {
		states[d.EventID] = d.State
	}
	require.Equal(t, map[string]string{"outbox-1": "applied", "outbox-2": "discarded"}, states)
}
