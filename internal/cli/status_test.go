package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

func TestStatusReportsInactiveSlotWithLagAndExitsNonZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, js := ns.Connect(t)
	stream := "ST_" + strings.ToUpper(db.Name)
	prefix := "st." + db.Name
	s, _, err := batonnats.ProvisionStream(ctx, js, batonnats.StreamConfig{Name: stream, SubjectPrefix: prefix}, batonnats.ProvisionOptions{})
	require.NoError(t, err)
	_, err = s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "audit", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)

	// A slot that no relay reads, with WAL written after it.
	slot := "slot_" + db.Name
	_, err = db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	require.NoError(t, err)
	_, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	_, _, err = schema.CreateConversation(ctx, db.Pool, u.ID, "c1", "")
	require.NoError(t, err)
	for i := range 50 {
		_, err = schema.InsertMessageTx(ctx, db.Pool, schema.UserMessage{OwnerID: u.ID, ConversationID: "c1", MessageID: fmt.Sprint("m", i), Content: strings.Repeat("x", 1000)})
		require.NoError(t, err)
	}

	args := []string{"status", "--database-url", db.URL, "--nats-url", ns.URL, "--stream", stream, "--subject-prefix", prefix, "--slot", slot}
	out, stderr, code := run(t, append(args, "--json")...)
	require.Equal(t, 3, code, "a slot nobody reads needs attention: %s", stderr)
	var rep struct {
		Slot struct {
			Exists   bool  `json:"exists"`
			Active   bool  `json:"active"`
			LagBytes int64 `json:"lag_bytes"`
		} `json:"slot"`
		Stream struct {
			Name string `json:"name"`
		} `json:"stream"`
		Groups []struct {
			Name string `json:"name"`
		} `json:"groups"`
		Outbox struct {
			ByStatus map[string]int `json:"by_status"`
		} `json:"outbox"`
		Attention []string `json:"attention"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.Slot.Exists)
	require.False(t, rep.Slot.Active)
	require.Greater(t, rep.Slot.LagBytes, int64(50*1000), "the lag covers the WAL written since the slot was made")
	require.Equal(t, stream, rep.Stream.Name)
	require.Len(t, rep.Groups, 1)
	require.Equal(t, "audit", rep.Groups[0].Name)
	require.Equal(t, 50, rep.Outbox.ByStatus["pending"])
	require.NotEmpty(t, rep.Attention)
	require.Contains(t, strings.Join(rep.Attention, "\n"), "inactive")

	text, _, code := run(t, args...)
	require.Equal(t, 3, code)
	require.Contains(t, text, "needs attention")
	require.Contains(t, text, slot)
	require.Contains(t, text, "audit")
}

func TestStatusOfMissingSlotNeedsAttention(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	out, _, code := run(t, "status", "--database-url", db.URL, "--nats-url", ns.URL, "--slot", "nothing_here")
	require.Equal(t, 3, code)
	require.Contains(t, out, "does not exist")
}
