package cli_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

func TestStatusShowsTheSizeAndOldestRowOfEachGrowingTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, u, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	_, _, err = schema.CreateConversation(ctx, db.Pool, u.ID, "c1", "")
	require.NoError(t, err)
	_, err = schema.InsertMessageTx(ctx, db.Pool, schema.UserMessage{OwnerID: u.ID, ConversationID: "c1", MessageID: "m1", Content: "hello"})
	require.NoError(t, err)
	// A row finished an hour ago is the oldest the retention rules count.
	finished := time.Now().Add(-time.Hour).Truncate(time.Second)
	_, err = db.Pool.Exec(ctx, `UPDATE agent_outbox SET status = 'done', processed_at = $1`, finished)
	require.NoError(t, err)

	out, stderr, _ := run(t, "status", "--json", "--database-url", db.URL, "--nats-url", ns.URL)
	var rep struct {
		Tables []struct {
			Table  string     `json:"table"`
			Bytes  int64      `json:"bytes"`
			Oldest *time.Time `json:"oldest"`
			Of     string     `json:"of"`
		} `json:"tables"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "%s\n%s", out, stderr)
	byName := map[string]int{}
	for i, tb := range rep.Tables {
		byName[tb.Table] = i
	}
	for _, name := range append([]string{"messages"}, schema.PrunedTables...) {
		require.Contains(t, byName, name, "status should list table %s: %s", name, out)
	}
	outbox := rep.Tables[byName[schema.TableOutbox]]
	require.Positive(t, outbox.Bytes)
	require.NotNil(t, outbox.Oldest, "the done outbox row is the oldest: %s", out)
	require.WithinDuration(t, finished, *outbox.Oldest, time.Second)
	require.Nil(t, rep.Tables[byName[schema.TableInbox]].Oldest, "an empty table has no oldest row")

	text, _, _ := run(t, "status", "--database-url", db.URL, "--nats-url", ns.URL)
	require.Contains(t, text, "TABLE")
	require.Regexp(t, `agent_outbox\s+\S+ \S*B\s+\d+\s+1h0m\d+s ago \(done or error row, finished\)`, text)
}
