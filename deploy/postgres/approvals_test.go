package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/status"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// TestEachRoleCanDoItsPartOfMCPToolsAndApprovals runs what MCP tools and
// approvals need, each as its component's role: a worker records a
// listing, stops a turn for an approval and, once the API's role decided
// it, resumes the turn, sends the call and finalizes; the relay's sweep
// looks at approvals; an admin accepts a changed definition; status lists
// the tools and the approvals. A missing grant fails the function that
// needs it.
func TestEachRoleCanDoItsPartOfMCPToolsAndApprovals(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	admin, api, worker, relayDB, statusDB := d.pool(t, "admin"), d.pool(t, "api"), d.pool(t, "worker"), d.pool(t, "relay"), d.pool(t, "status")

	token, _, err := schema.CreateToken(ctx, admin, "alice")
	require.NoError(t, err)
	user, err := schema.Authenticate(ctx, api, token)
	require.NoError(t, err)
	var conv schema.Conversation
	inTx(t, api, "a conversation and a message as baton_api", func(tx pgx.Tx) error {
		if conv, _, err = schema.CreateConversation(ctx, tx, user.ID, "mcp", ""); err != nil {
			return err
		}
		_, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "mcp", MessageID: "m1", Content: "pay bob"})
		return err
	})

	listed := func(sum string) {
		_, err := schema.RecordMCPListing(ctx, worker, "pay", []schema.MCPListedTool{{Tool: "send", SHA256: sum, Definition: []byte(`{"name":"send"}`), Effect: schema.EffectWrite}})
		require.NoError(t, err, "RecordMCPListing as baton_worker")
	}
	listed("a")
	listed("b")
	require.NoError(t, schema.RecordMCPServer(ctx, worker, "pay", ""), "RecordMCPServer as baton_worker")

	var claim schema.Claim
	claimAs := func(run string) {
		inTx(t, worker, "ClaimTx as baton_worker", func(tx pgx.Tx) error {
			claim, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: conv.Key, RunID: run, Worker: "w", Lease: time.Minute, MaxAttempts: 3})
			return err
		})
	}
	claimAs("run_1")
	var req schema.Requested
	inTx(t, worker, "RequestApprovalTx as baton_worker", func(tx pgx.Tx) error {
		req, err = schema.RequestApprovalTx(ctx, tx, schema.ApprovalRequest{
			ConversationID: conv.Key, RunID: "run_1", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, TTL: time.Hour, State: []byte(`{}`),
			Operation: schema.Operation{RunID: "run_1", ConversationID: conv.Key, ToolCallID: "c1", Tool: "pay__send", ToolVersion: "1",
				Effect: schema.EffectWrite, IdempotencyKey: "mcp_k", Arguments: `{"to":"bob"}`, DefinitionSHA256: "a"},
		})
		return err
	})
	inTx(t, relayDB, "the sweep as baton_relay", func(tx pgx.Tx) error {
		_, err := schema.AnnounceStaleTx(ctx, tx, 0, 100)
		return err
	})
	_, err = schema.ListApprovals(ctx, api, user.ID, "mcp", 10)
	require.NoError(t, err, "ListApprovals as baton_api")
	inTx(t, api, "DecideApprovalTx as baton_api", func(tx pgx.Tx) error {
		_, err := schema.DecideApprovalTx(ctx, tx, user.ID, "mcp", req.ApprovalID, schema.Decision{Approved: true, UserID: user.ID})
		return err
	})
	claimAs("run_2")
	require.NotNil(t, claim.Resume, "the worker resumes the approved turn")
	inTx(t, worker, "StartApprovedOperationTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.StartApprovedOperationTx(ctx, tx, conv.Key, "run_2", claim.Resume.OperationID, claim.Resume.ArgumentsSHA256)
		return err
	})
	require.NoError(t, schema.CompleteOperation(ctx, worker, claim.Resume.OperationID, "sent"))
	inTx(t, worker, "FinalizeTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.FinalizeTx(ctx, tx, schema.Finalize{ConversationID: conv.Key, RunID: "run_2", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Content: "paid"})
		return err
	})

	accepted, err := schema.AcceptMCPTools(ctx, admin, "pay", "send")
	require.NoError(t, err, "AcceptMCPTools as baton_admin")
	require.Len(t, accepted, 1)
	report, err := status.Gather(ctx, statusDB, nil, status.Options{Slot: relay.DefaultSlot, Stream: batonnats.DefaultStream})
	require.NoError(t, err, "baton status's report as baton_status")
	require.Len(t, report.MCPServers, 1)
}
