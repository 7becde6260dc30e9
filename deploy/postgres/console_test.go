package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/status"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/relay"
	"github.com/batonhq/baton/schema"
)

// TestTheConsoleRoleReadsWhatItShowsAndWritesOnlyThroughTheOperatorsPaths
// runs what `baton console` does, as baton_console: sign-in with an
// operator token and its session, the overview (status without its scans,
// the turns), conversations, the failed turn and its journal, the outcome
// of an unknown write recorded and the turn resumed, the user's retry,
// dead letters discarded and marked for retry (which baton_group finds and
// clears), and the record of operators' actions, which baton_relay prunes.
// A missing grant fails the function that needs it.
func TestTheConsoleRoleReadsWhatItShowsAndWritesOnlyThroughTheOperatorsPaths(t *testing.T) {
	d := newDatabase(t)
	d.migrate(t)
	ctx := context.Background()
	admin, api, worker, group, relayDB, consoleDB := d.pool(t, "admin"), d.pool(t, "api"), d.pool(t, "worker"), d.pool(t, "group"), d.pool(t, "relay"), d.pool(t, "console")

	opToken, _, err := schema.CreateOperatorToken(ctx, admin, "ops-ada", schema.RoleAdmin, time.Time{})
	require.NoError(t, err, "token create --admin as baton_admin")
	op, err := schema.AuthenticateOperator(ctx, consoleDB, opToken)
	require.NoError(t, err, "AuthenticateOperator as baton_console")
	sess, err := schema.StartConsoleSession(ctx, consoleDB, op, []byte("hash-of-a-secret"), time.Now().Add(time.Hour))
	require.NoError(t, err, "StartConsoleSession as baton_console")
	_, err = schema.ConsoleSessionBySecret(ctx, consoleDB, []byte("hash-of-a-secret"), time.Minute)
	require.NoError(t, err, "ConsoleSessionBySecret as baton_console")

	// A conversation whose turn sent a write, lost its answer and failed.
	userToken, _, err := schema.CreateToken(ctx, admin, "alice")
	require.NoError(t, err)
	user, err := schema.Authenticate(ctx, api, userToken)
	require.NoError(t, err)
	var key string
	inTx(t, api, "a message as baton_api", func(tx pgx.Tx) error {
		if _, _, err := schema.CreateConversation(ctx, tx, user.ID, "c1", "Title"); err != nil {
			return err
		}
		res, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: user.ID, ConversationID: "c1", MessageID: "m1", Content: "pay bob"})
		key = res.ConversationKey
		return err
	})
	var claim schema.Claim
	inTx(t, worker, "ClaimTx as baton_worker", func(tx pgx.Tx) error {
		claim, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: key, RunID: "run_1", Worker: "w", Lease: time.Minute, MaxAttempts: 3, MaxRows: 10})
		return err
	})
	inTx(t, worker, "RecordStepTx as baton_worker", func(tx pgx.Tx) error {
		return schema.RecordStepTx(ctx, tx, schema.StepParams{ConversationID: key, RunID: "run_1", TurnID: claim.TurnID, Step: 0, Answer: []byte(`{"calls":[]}`)})
	})
	var opID int64
	inTx(t, worker, "StartOperationTx as baton_worker", func(tx pgx.Tx) error {
		opID, err = schema.StartOperationTx(ctx, tx, schema.Operation{RunID: "run_1", ConversationID: key, TurnID: claim.TurnID, ToolCallID: "call_1",
			Tool: "pay", ToolVersion: "1", Effect: schema.EffectWrite, IdempotencyKey: "k1", Arguments: `{}`})
		return err
	})
	require.NoError(t, schema.UnknownOperation(ctx, worker, opID, "timeout"))
	inTx(t, worker, "FailAttemptTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.FailAttemptTx(ctx, tx, schema.Failure{ConversationID: key, RunID: "run_1", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Reason: "unknown outcome", MaxAttempts: 3})
		return err
	})

	// The overview, as the console gathers it.
	_, err = status.Gather(ctx, consoleDB, nil, status.Options{Slot: relay.DefaultSlot, Stream: batonnats.DefaultStream, NoScans: true})
	require.NoError(t, err, "status.Gather without scans as baton_console")
	stats, err := schema.ReadTurnStats(ctx, consoleDB)
	require.NoError(t, err, "ReadTurnStats as baton_console")
	require.Equal(t, int64(1), stats.FailedLastHour)

	// Conversations and the failed turn.
	found, err := schema.ConversationsOfUser(ctx, consoleDB, "alice", nil, 10)
	require.NoError(t, err, "ConversationsOfUser as baton_console")
	require.Len(t, found, 1)
	_, err = schema.ConversationsByID(ctx, consoleDB, "c1", 10)
	require.NoError(t, err, "ConversationsByID as baton_console")
	rec, err := schema.ReadConversationRecord(ctx, consoleDB, key, 0, 50)
	require.NoError(t, err, "ReadConversationRecord as baton_console")
	require.Len(t, rec.Turns, 1)
	failed, _, err := schema.FailedTurns(ctx, consoleDB, nil, 50)
	require.NoError(t, err, "FailedTurns as baton_console")
	require.Len(t, failed, 1)
	require.Len(t, failed[0].UnknownWrites(), 1)
	_, err = schema.StuckTurns(ctx, consoleDB, schema.StuckOptions{LeaseGrace: time.Minute, PendingAfter: time.Minute, ApprovalAfter: time.Hour, Limit: 10})
	require.NoError(t, err, "StuckTurns as baton_console")

	// The operator records the outcome and the turn goes on from its
	// journal; the retry is announced.
	inTx(t, consoleDB, "RecordOutcomeTx, ResumeTurnTx and AnnounceTx as baton_console", func(tx pgx.Tx) error {
		if _, err := schema.RecordOutcomeTx(ctx, tx, schema.Outcome{ConversationKey: key, OperationID: opID, Done: true, Result: "sent", Operator: op.Name}); err != nil {
			return err
		}
		res, err := schema.ResumeTurnTx(ctx, tx, key)
		if err != nil {
			return err
		}
		if err := schema.AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, res.OutboxIDs); err != nil {
			return err
		}
		return schema.RecordOperatorActionTx(ctx, tx, op, schema.ActionResumeTurn, key, "")
	})
	// It fails again, and the operator retries it the user's way.
	inTx(t, worker, "ClaimTx of the resumed turn as baton_worker", func(tx pgx.Tx) error {
		claim, err = schema.ClaimTx(ctx, tx, schema.ClaimParams{ConversationID: key, RunID: "run_2", Worker: "w", Lease: time.Minute, MaxAttempts: 3, MaxRows: 10})
		return err
	})
	inTx(t, worker, "FailAttemptTx as baton_worker", func(tx pgx.Tx) error {
		_, err := schema.FailAttemptTx(ctx, tx, schema.Failure{ConversationID: key, RunID: "run_2", TurnID: claim.TurnID, OutboxIDs: claim.OutboxIDs, Reason: "model down", Terminal: true, MaxAttempts: 3})
		return err
	})
	inTx(t, consoleDB, "RetryFailedTx and AnnounceTx as baton_console", func(tx pgx.Tx) error {
		// The turn made a write: without the operator's word to repeat
		// it, the retry is refused, as the user's is.
		_, err := schema.RetryFailedTx(ctx, tx, schema.Retry{OwnerID: user.ID, ConversationID: "c1"})
		if !errors.Is(err, schema.ErrTurnMadeWrites) {
			return fmt.Errorf("a retry of a turn that made writes: got %v, want ErrTurnMadeWrites", err)
		}
		res, err := schema.RetryFailedTx(ctx, tx, schema.Retry{OwnerID: user.ID, ConversationID: "c1", RepeatWrites: true})
		if err != nil {
			return err
		}
		return schema.AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, res.OutboxIDs)
	})

	// Dead letters: one discarded, one marked for retry, whose mark the
	// group finds and clears.
	for _, ev := range []string{"outbox-1", "outbox-2"} {
		require.NoError(t, schema.Park(ctx, group, schema.DeadLetter{Group: "webhook", EventID: ev, Stream: "BATON_OUTBOX", StreamSeq: 1,
			Subject: "baton.outbox.0.x", Payload: []byte(`{}`), Attempts: 3, Error: "HTTP 500"}), "Park as baton_group")
	}
	groups, err := schema.DeadLetterGroups(ctx, consoleDB)
	require.NoError(t, err, "DeadLetterGroups as baton_console")
	require.Len(t, groups, 1)
	page, err := schema.DeadLetterPage(ctx, consoleDB, "webhook", 0, 10)
	require.NoError(t, err, "DeadLetterPage as baton_console")
	require.Len(t, page, 2)
	inTx(t, consoleDB, "DiscardDeadLetterTx and RequestDeadLetterRetryTx as baton_console", func(tx pgx.Tx) error {
		if _, err := schema.DiscardDeadLetterTx(ctx, tx, "webhook", page[0].ID); err != nil {
			return err
		}
		_, err := schema.RequestDeadLetterRetryTx(ctx, tx, "webhook", page[1].ID, op.Name)
		return err
	})
	marked, err := schema.DeadLettersToRetry(ctx, group, "webhook", 10)
	require.NoError(t, err, "DeadLettersToRetry as baton_group")
	require.Equal(t, []int64{page[1].ID}, marked)
	require.NoError(t, schema.ClearDeadLetterRetry(ctx, group, "webhook", page[1].ID), "ClearDeadLetterRetry as baton_group")
	inTx(t, group, "ResolveDeadLetterTx as baton_group", func(tx pgx.Tx) error {
		return schema.ResolveDeadLetterTx(ctx, tx, "webhook", "outbox-2")
	})

	// The record of operators' actions, listed; ended sessions deleted;
	// the relay prunes the record.
	acts, err := schema.OperatorActions(ctx, consoleDB, 0, 10)
	require.NoError(t, err, "OperatorActions as baton_console")
	require.Len(t, acts, 1)
	require.NoError(t, schema.EndConsoleSession(ctx, consoleDB, sess.ID), "EndConsoleSession as baton_console")
	n, err := schema.PruneConsoleSessions(ctx, consoleDB, time.Minute, 10)
	require.NoError(t, err, "PruneConsoleSessions as baton_console")
	require.Equal(t, int64(1), n)
	res, err := schema.Prune(ctx, relayDB, schema.Retention{OperatorActions: time.Nanosecond}, nil, nil)
	require.NoError(t, err, "Prune as baton_relay")
	require.Equal(t, int64(1), res.Rows[schema.TableOperatorActions])
}
