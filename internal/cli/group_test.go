package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
)

func TestStatusCountsParkedEventsAndSaysHowToReplayThem(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	ns := testenv.StartNATS(t)
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO group_dead_letters (group_name, event_id, stream, stream_seq, subject, payload, attempts, error)
		VALUES ('webhook', 'outbox-7', 'BATON_OUTBOX', 7, 'baton.outbox.0.Yw', '{}', 5, 'webhook answered 500'),
		       ('webhook', 'outbox-9', 'BATON_OUTBOX', 9, 'baton.outbox.0.Yw', '{}', 5, 'webhook answered 500')`)
	require.NoError(t, err)

	out, stderr, code := run(t, "status", "--json", "--database-url", db.URL, "--nats-url", ns.URL)
	require.Equal(t, 3, code, stderr)
	var rep struct {
		DeadLetters []struct {
			Group    string `json:"group"`
			Count    int    `json:"count"`
			FirstSeq int    `json:"first_seq"`
		} `json:"dead_letters"`
		Attention []string `json:"attention"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.DeadLetters, 1)
	require.Equal(t, "webhook", rep.DeadLetters[0].Group)
	require.Equal(t, 2, rep.DeadLetters[0].Count)
	require.Contains(t, strings.Join(rep.Attention, "\n"), "baton replay --group webhook --from-seq 7")

	text, _, _ := run(t, "status", "--database-url", db.URL, "--nats-url", ns.URL)
	require.Contains(t, text, "DEAD LETTERS")
}
