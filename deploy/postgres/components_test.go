package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsclient "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/status"
	"github.com/batonhq/baton/internal/testenv"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// inTx runs f in a transaction of pool that commits when f returns nil.
func inTx(t *testing.T, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, what string, f func(tx pgx.Tx) error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, f(tx), what)
	require.NoError(t, tx.Commit(ctx), what)
}

// TestEachRoleCanDoWhatItsComponentDoes runs the schema's functions, the
// same the components call, each as its component's role: tokens as
// baton_admin, the API's reads and writes as baton_api, a turn's claim,
// operations, finalize, failure and recovery as baton_worker, the relay's
// announcements and heartbeat as baton_relay, a group's inbox, dead
// letters and audit log as baton_group, and `baton status`'s report as
// baton_status. A missing grant fails the function that needs it.
func TestEachRoleCanDoWhatItsComponentDoes(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	admin, api, worker, relayDB, group, statusDB := d.pool(t, "admin"), d.pool(t, "api"), d.pool(t, "worker"), d.pool(t, "relay"), d.pool(t, "group"), d.pool(t, "status")

	// baton_admin: baton token create, list, revoke.
	token, _, err := schema.CreateTokenUntil(ctx, admin, "alice", time.Now().Add(time.Hour))
	require.NoError(t, err, "token create as baton_admin")
	_, _, err = schema.CreateToken(ctx, admin, "alice")
	require.NoError(t, err, "a second token for an existing user as baton_admin")
	tokens, err := schema.ListTokens(ctx, admin, "alice")
	require.NoError(t, err, "token list as baton_admin")
	require.Len(t, tokens, 2)
	_, err = schema.RevokeToken(ctx, admin, tokens[1].ID)
	require.NoError(t, err, "token revoke as baton_admin")

	// baton_api: authenticate, conversations, messages, a retry.
	user, err := schema.Authenticate(ctx, api, token)
	require.NoError(t, err, "Authenticate as baton_api")
	active, err := schema.TokenActive(ctx, api, user.TokenID)
	require.NoError(t, err)
	require.True(t, active)
	jwtUser, err := schema.EnsureUser(ctx, api, "https://tenant.example.com/|auth0|64f1c2")
	require.NoError(t, err, "EnsureUser (a JWT's user, made on first sight) as baton_api")
	again, err := schema.EnsureUser(ctx, api, "https://tenant.example.com/|auth0|64f1c2")
	require.NoError(t, err, "EnsureUser of an existing user as baton_api")
	require.Equal(t, jwtUser.ID, again.ID)
	var conv schema.Conversation
	inTx(t, api, "create a conversation as baton_api", func(tx pgx.Tx) error {
		if err := schema.CheckConversationQuotaTx(ctx, tx, user.ID, 10); err != nil {
			return err
		}
		conv, _, err = schema.CreateConversation(ctx, tx, user.ID, "demo", "Demo")
		return err
	})
	send := func(id string) schema.InsertResult {
		var res schema.InsertResult
		inTx(t, api, "InsertMessageTx as baton_api", func(tx pgx.Tx) error {
			res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "demo", MessageID: id, Content: "hello " + id})
			return err
		})
		return res
	}
	first := send("m1")
	require.True(t, send("m1").Existed, "a retry of the same message as baton_api")
	_, err = schema.ListConversations(ctx, api, user.ID, 10)
	require.NoError(t, err)
	_, err = schema.GetConversation(ctx, api, user.ID, "demo")
	require.NoError(t, err)
	_, _, err = schema.ListMessages(ctx, api, user.ID, "demo", "", 10)
	require.NoError(t, err)
	require.NoError(t, schema.MarkRead(ctx, api, user.ID, "demo"))

	// baton_worker's database session: numbered, its lock taken on a
	// connection of its own, recorded on the runs it claims.
	sessionConn, err := worker.Acquire(ctx)
	require.NoError(t, err)
	defer sessionConn.Release()
	session, err := schema.NextWorkerSession(ctx, sessionConn)
	require.NoError(t, err, "NextWorkerSession as baton_worker")
	took, err := schema.TakeWorkerSession(ctx, sessionConn, session)
	require.NoError(t, err, "TakeWorkerSession as baton_worker")
	require.True(t, took, "the session's lock is free")
	// baton_worker: a turn with a read and a write operation, finalized.
	var claim schema.Claim
	claimAs := func(runID string) {
		inTx(t, worker, "ClaimTx as baton_worker", func(tx pgx.Tx) error {
			claim, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{
				ConversationID: conv.Key, RunID: runID, Worker: "w1", Lease: time.Minute, MaxAttempts: 3, MaxRows: 20, Session: session,
			})
			return err
		})
		require.False(t, claim.Empty(), "run %s claims a pending row", runID)
	}
	claimAs("run_1")
	require.Equal(t, []int64{first.OutboxID}, claim.OutboxIDs)
	// A claim of a held conversation asks whether its run's worker is gone.
	inTx(t, worker, "ClaimTx of a held conversation as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.ClaimTx(ctx, tx, schema.ClaimParams{
			ConversationID: conv.Key, RunID: "run_busy", Worker: "w1", Lease: time.Minute, MaxAttempts: 3, MaxRows: 20, Session: session,
		})
		var busy *schema.BusyError
		if errors.As(err, &busy) {
			return nil
		}
		return err
	})
	inTx(t, worker, "RecoverOrphanedTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.RecoverOrphanedTx(ctx, tx, 10, 3)
		return err
	})
	_, err = schema.LoadTurn(ctx, worker, conv.Key, claim.OutboxIDs, 10)
	require.NoError(t, err, "LoadTurn as baton_worker")
	_, err = schema.RenewLease(ctx, worker, conv.Key, "run_1", time.Minute)
	require.NoError(t, err, "RenewLease as baton_worker")
	operation := func(callID string, effect schema.Effect) int64 {
		var id int64
		inTx(t, worker, "StartOperationTx as baton_worker", func(tx pgx.Tx) error {
			id, err = schema.StartOperationTx(ctx, tx, schema.Operation{
				RunID: "run_1", ConversationID: conv.Key, ToolCallID: callID, Tool: "clock", ToolVersion: "1", Effect: effect, Arguments: "{}",
			})
			return err
		})
		return id
	}
	read := operation("call_1", schema.EffectRead)
	require.NoError(t, schema.CompleteOperation(ctx, worker, read, "noon"))
	write := operation("call_2", schema.EffectWrite)
	require.NoError(t, schema.RecordSideEffect(ctx, worker, write, "key", conv.Key, "payload"))
	require.NoError(t, schema.FailOperation(ctx, worker, write, "refused"))
	inTx(t, worker, "FinalizeTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.FinalizeTx(ctx, tx, schema.Finalize{
			ConversationID: conv.Key, RunID: "run_1", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Content: "hi",
		})
		return err
	})

	// A turn that gives up, retried by the user (the API), claimed again
	// and recovered (the worker), then abandoned.
	send("m2")
	claimAs("run_2")
	inTx(t, worker, "FailAttemptTx as baton_worker", func(tx pgx.Tx) error {
		out, err := schema.FailAttemptTx(ctx, tx, schema.Failure{
			ConversationID: conv.Key, RunID: "run_2", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Reason: "model down", MaxAttempts: 1,
		})
		if err == nil && !out.GaveUp {
			err = fmt.Errorf("the turn should give up at its one attempt")
		}
		return err
	})
	inTx(t, api, "RetryFailedTx and AnnounceTx as baton_api", func(tx pgx.Tx) error {
		res, err := schema.RetryFailedTx(ctx, tx, schema.Retry{OwnerID: user.ID, ConversationID: "demo", MaxPerHour: 10})
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, res.OutboxIDs)
	})
	claimAs("run_3")
	inTx(t, worker, "recovery as baton_worker", func(tx pgx.Tx) error {
		if _, err := schema.RecoverExpiredTx(ctx, tx, 10, 3); err != nil {
			return err
		}
		r, err := schema.RecoverRunTx(ctx, tx, conv.Key, "run_3", 3, "the worker shut down")
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonRetry, r.RetryIDs)
	})
	require.NoError(t, schema.MarkRun(ctx, worker, "run_3", "abandoned", "lost its lease"), "MarkRun as baton_worker")

	// A stop (the API), noticed at the renewal and finalized stopped (the
	// worker); the chat reads of the API; a regenerate (the API), whose
	// turn is stopped and recovered stopped (the worker).
	send("m3")
	claimAs("run_4")
	inTx(t, api, "StopTx as baton_api", func(tx pgx.Tx) error {
		_, err := schema.StopTx(ctx, tx, user.ID, "demo")
		return err
	})
	_, err = schema.RenewLease(ctx, worker, conv.Key, "run_4", time.Minute)
	require.ErrorIs(t, err, schema.ErrStopRequested, "RenewLease as baton_worker sees the stop")
	stopped, err := schema.FinalizeTurn(ctx, worker, schema.Finalize{
		ConversationID: conv.Key, RunID: "run_4", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Content: "partial", Stopped: true,
	})
	require.NoError(t, err, "FinalizeTurn of a stopped turn as baton_worker")
	require.True(t, stopped.Stopped)
	row, err := schema.ReadRowTurn(ctx, api, conv.Key, claim.OutboxIDs[0])
	require.NoError(t, err, "ReadRowTurn as baton_api")
	require.Equal(t, stopped.MessageID, row.ReplyID)
	_, err = schema.ChatReply(ctx, api, conv.Key, stopped.MessageID)
	require.NoError(t, err, "ChatReply as baton_api")
	_, _, err = schema.ChatHistory(ctx, api, user.ID, "demo", "", 100)
	require.NoError(t, err, "ChatHistory as baton_api")
	_, _, err = schema.ActiveRow(ctx, api, conv.Key)
	require.NoError(t, err, "ActiveRow as baton_api")
	inTx(t, api, "RegenerateTx and AnnounceTx as baton_api", func(tx pgx.Tx) error {
		g, err := schema.RegenerateTx(ctx, tx, schema.Regenerate{OwnerID: user.ID, ConversationID: "demo", MessageID: "m3", MaxPerHour: 10})
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, g.OutboxIDs)
	})
	claimAs("run_5")
	inTx(t, api, "StopTx as baton_api", func(tx pgx.Tx) error {
		_, err := schema.StopTx(ctx, tx, user.ID, "demo")
		return err
	})
	inTx(t, worker, "recovery of a stopped run as baton_worker", func(tx pgx.Tx) error {
		r, err := schema.RecoverRunTx(ctx, tx, conv.Key, "run_5", 3, "the worker shut down")
		if err == nil && r.Outcome != schema.RecoveryStopped {
			err = fmt.Errorf("recovered %s, want stopped", r.Outcome)
		}
		return err
	})

	// baton_relay: the sweeper, the announcements of a new slot, the
	// heartbeat.
	inTx(t, relayDB, "the relay's announcements as baton_relay", func(tx pgx.Tx) error {
		if _, err := schema.AnnounceStaleTx(ctx, tx, 0, 100); err != nil {
			return err
		}
		_, err := schema.AnnouncePendingTx(ctx, tx, 0, 100)
		return err
	})
	require.NoError(t, schema.EmitHeartbeat(ctx, relayDB, time.Now()), "the heartbeat as baton_relay")

	// baton_group: inbox, audit log, dead letters, replay's counts.
	inTx(t, group, "an audit event applied as baton_group", func(tx pgx.Tx) error {
		fresh, err := schema.RecordGroupEventTx(ctx, tx, "audit", "outbox-1", 1, first.OutboxID)
		if err != nil || !fresh {
			return fmt.Errorf("inbox: fresh=%v: %w", fresh, err)
		}
		if err := schema.AppendAuditTx(ctx, tx, schema.AuditEvent{
			Group: "audit", EventID: "outbox-1", StreamSeq: 1, Subject: "baton.outbox.0.x", OutboxID: first.OutboxID,
			ConversationID: conv.Key, MessageID: first.MessageKey, Reason: "insert", OutboxCreatedAt: time.Now(), PublishedAt: time.Now(),
		}); err != nil {
			return err
		}
		return schema.ResolveDeadLetterTx(ctx, tx, "audit", "outbox-1")
	})
	require.NoError(t, schema.Park(ctx, group, schema.DeadLetter{
		Group: "webhook", EventID: "outbox-2", Stream: "BATON_OUTBOX", StreamSeq: 2, Subject: "baton.outbox.0.x",
		Headers: []byte(`{"Nats-Msg-Id":["outbox-2"]}`), Payload: []byte(`{}`), Attempts: 3, Error: "HTTP 500",
	}), "Park as baton_group")
	parked, err := schema.DeadLetters(ctx, group, "webhook", true)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	applied, err := schema.GroupApplied(ctx, group, "audit", "outbox-1")
	require.NoError(t, err)
	require.True(t, applied)
	_, err = schema.CountGroupApplied(ctx, group, "audit", 1, 10)
	require.NoError(t, err)

	// baton_status: the whole report, without NATS.
	report, err := status.Gather(ctx, statusDB, nil, status.Options{Slot: relay.DefaultSlot, Stream: batonnats.DefaultStream})
	require.NoError(t, err, "baton status's report as baton_status")
	require.Equal(t, int64(3), report.Outbox.ByStatus["done"])
	require.Len(t, report.DeadLetters, 1)
	require.NotContains(t, report.Errors, "tables", "the status role reads the table sizes and oldest rows")
	require.NotEmpty(t, report.Tables)

	// The API deletes the conversation: its messages, outbox rows, runs
	// and operations go with it (the cascade runs as the tables' owner).
	_, err = schema.DeleteConversation(ctx, api, user.ID, "demo")
	require.NoError(t, err, "DeleteConversation as baton_api")
	var left int
	require.NoError(t, d.superuser(t).QueryRow(ctx, `SELECT (SELECT count(*) FROM messages) + (SELECT count(*) FROM agent_runs) + (SELECT count(*) FROM operations)`).Scan(&left))
	require.Zero(t, left)
}

var slots atomic.Int64

// TestTheRelayStreamsAsBatonRelay runs the relay as baton_relay: it finds
// the publication the migrator made, creates its slot, streams over a
// logical replication connection and publishes a message the API role
// stored.
func TestTheRelayStreamsAsBatonRelay(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	n := testenv.StartNATS(t)
	nc, _ := n.Connect(t)
	published := make(chan *natsclient.Msg, 16)
	sub, err := nc.ChanSubscribe(batonnats.DefaultSubjectPrefix+".>", published)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	r, err := relay.New(relay.Config{
		Slot:              fmt.Sprintf("deploy_%d_%d", os.Getpid(), slots.Add(1)),
		HeartbeatInterval: 50 * time.Millisecond,
		SweepInterval:     time.Hour,
		SweepAge:          time.Hour,
	}, d.pool(t, "relay"), nc)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "the relay stops cleanly")
	})

	admin, api := d.pool(t, "admin"), d.pool(t, "api")
	_, user, err := schema.CreateToken(ctx, admin, "bob")
	require.NoError(t, err)
	_, _, err = schema.CreateConversation(ctx, api, user.ID, "c", "")
	require.NoError(t, err)
	var res schema.InsertResult
	inTx(t, api, "InsertMessageTx as baton_api", func(tx pgx.Tx) error {
		res, err = schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "c", MessageID: "m", Content: "x"})
		return err
	})
	msg := testenv.WaitOrTimeout(t, published, 30*time.Second, "the relay, as baton_relay, publishes the outbox row")
	require.Equal(t, fmt.Sprint(res.OutboxID), msg.Header.Get("Baton-Outbox-Id"))
}
