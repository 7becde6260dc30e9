package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/status"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// TestTheWorkerRecordsWhetherItsAgentAnswersAndStatusListsIt: a worker
// records an external agent's failure, then an answer merged with it, as
// baton_worker; `baton status`'s report lists the agent as baton_status.
// A missing grant fails the function that needs it.
func TestTheWorkerRecordsWhetherItsAgentAnswersAndStatusListsIt(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	worker, statusDB := d.pool(t, "worker"), d.pool(t, "status")

	failedAt := time.Now()
	answeredAt := failedAt.Add(time.Second)
	for _, r := range []schema.AgentReach{
		{Since: failedAt, ErrorAt: &failedAt, Error: "agent_unavailable: 502 Bad Gateway"},
		{Reachable: true, Since: answeredAt, OKAt: &answeredAt},
	} {
		r.Name, r.Protocol, r.Origin = "ag-ui https://agent.example.com", "ag-ui", "https://agent.example.com"
		require.NoError(t, schema.RecordAgentReach(ctx, worker, r), "RecordAgentReach as baton_worker")
	}
	report, err := status.Gather(ctx, statusDB, nil, status.Options{Slot: relay.DefaultSlot, Stream: batonnats.DefaultStream})
	require.NoError(t, err, "baton status's report as baton_status")
	require.Len(t, report.Agents, 1)
	require.True(t, report.Agents[0].Reachable)
	require.Equal(t, "agent_unavailable: 502 Bad Gateway", report.Agents[0].LastError)
}
