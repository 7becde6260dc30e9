package group

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/schema"
)

func TestAParkedEventIsRetriedFromItsDeadLetterOrDiscardedAndNeverAppliedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createEffects(t, b)
	b.RelayStreaming()
	ctx := context.Background()

	var fixed atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if ev.ConversationID != b.Key("fine") && !fixed.Load() {
			return Permanent(errors.New("receiver refused it"))
		}
		return recordEffect(ctx, tx, ev)
	}
	reg := prometheus.NewRegistry()
	cfg := b.groupConfig("fragile", handler)
	cfg.Registerer = reg
	settled := make(chan Outcome, 16)
	cfg.OnSettled = func(_ Event, o Outcome) { settled <- o }
	stop := b.startGroup(cfg)
	b.Conversation("fine")
	b.Conversation("poison")
	b.Send("poison", "p1", "one")
	b.Send("poison", "p2", "two")
	b.Send("fine", "f1", "ok")
	parked := 0
	for parked < 2 {
		select {
		case o := <-settled:
			if o == OutcomeParked {
				parked++
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("two events were not parked within 30s")
		}
	}
	b.ConsumerSettled("fragile", 30*time.Second)
	require.NoError(t, stop())
	dead, err := DeadLetters(ctx, b.DB.Pool, "fragile", false)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.NotNil(t, dead[0].PublishedAt, "the dead letter keeps when the stream stored the event")

	// The gauge counts them, read from the table.
	reg = prometheus.NewRegistry()
	cfg.Registerer = reg
	g, err := New(cfg, b.DB.Pool, b.JS)
	require.NoError(t, err)
	g.refreshDeadLetters(ctx)
	require.Equal(t, 2.0, gaugeValue(t, reg, "baton_group_dead_letters"))

	// Still failing: the retry parks it again, counted, and says so.
	_, err = g.RetryDeadLetter(ctx, dead[0].ID)
	require.ErrorContains(t, err, "receiver refused it")
	again, err := schema.DeadLetterByID(ctx, b.DB.Pool, "fragile", dead[0].ID, false)
	require.NoError(t, err)
	require.Equal(t, 2, again.Parked)
	require.Nil(t, again.ResolvedAt)

	// Fixed: the retry applies it once and resolves it; a second retry is
	// refused, and applies nothing.
	fixed.Store(true)
	out, err := g.RetryDeadLetter(ctx, dead[0].ID)
	require.NoError(t, err)
	require.Equal(t, OutcomeApplied, out)
	_, err = g.RetryDeadLetter(ctx, dead[0].ID)
	require.ErrorIs(t, err, schema.ErrResolved)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM test_effects WHERE event_id = $1`, dead[0].EventID))

	// Discarded: kept, resolved as discarded, in the inbox so that no
	// replay applies it; a second discard is refused.
	err = pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
		_, err := schema.DiscardDeadLetterTx(ctx, tx, "fragile", dead[1].ID)
		return err
	})
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
		_, err := schema.DiscardDeadLetterTx(ctx, tx, "fragile", dead[1].ID)
		return err
	})
	require.ErrorIs(t, err, schema.ErrResolved)
	_, err = schema.DeadLetterByID(ctx, b.DB.Pool, "other", dead[1].ID, false)
	require.ErrorIs(t, err, schema.ErrNotFound, "a dead letter is looked up within its group")

	res, err := Replay(ctx, ReplayConfig{JetStream: b.JS, Stream: b.Stream, Group: "fragile", From: Position{All: true}, Runner: g, ProgressInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Total)
	require.Zero(t, b.Count(`SELECT count(*) FROM test_effects WHERE event_id = $1`, dead[1].EventID), "a discarded event is not applied by a replay")
	require.Equal(t, 2, b.Count(`SELECT count(*) FROM test_effects`), "fine and the retried event, once each")

	all, err := DeadLetters(ctx, b.DB.Pool, "fragile", true)
	require.NoError(t, err)
	require.Len(t, all, 2, "nothing is deleted")
	states := map[string]string{}
	for _, d := range all {
		require.NotNil(t, d.ResolvedAt)
		states[d.EventID] = d.Resolution
	}
	require.Equal(t, map[string]string{dead[0].EventID: schema.ResolutionApplied, dead[1].EventID: schema.ResolutionDiscarded}, states,
		fmt.Sprint("resolutions: ", states))
	g.refreshDeadLetters(ctx)
	require.Zero(t, gaugeValue(t, reg, "baton_group_dead_letters"))
}

// gaugeValue reads the one series of a gauge from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestADeadLetterMarkedForRetryIsAppliedByTheGroupsOwnProcess: the
// console only marks a dead letter; the running group finds the mark,
// retries the event with its handler and clears it. Still failing, the
// event is parked again without its mark (no retry loop); fixed and
// marked again, it is applied once and resolved.
func TestADeadLetterMarkedForRetryIsAppliedByTheGroupsOwnProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createEffects(t, b)
	b.RelayStreaming()
	ctx := context.Background()

	var fixed atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if !fixed.Load() {
			return Permanent(errors.New("receiver refused it"))
		}
		return recordEffect(ctx, tx, ev)
	}
	cfg := b.groupConfig("marked", handler)
	cfg.RetryRequestInterval = 50 * time.Millisecond
	settled := make(chan Outcome, 16)
	cfg.OnSettled = func(_ Event, o Outcome) { settled <- o }
	stop := b.startGroup(cfg)
	t.Cleanup(func() { _ = stop() })
	b.Conversation("poison")
	b.Send("poison", "p1", "one")
	require.Equal(t, OutcomeParked, <-settled)

	dead, err := DeadLetters(ctx, b.DB.Pool, "marked", false)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	mark := func() {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
			_, err := schema.RequestDeadLetterRetryTx(ctx, tx, "marked", dead[0].ID, "ops-ada")
			return err
		}))
	}
	mark()
	require.Equal(t, OutcomeParked, <-settled, "the group retried it, and it failed again")
	d, err := schema.DeadLetterByID(ctx, b.DB.Pool, "marked", dead[0].ID, false)
	require.NoError(t, err)
	require.Nil(t, d.RetryRequestedAt, "parking it again cleared the mark")
	require.Equal(t, 2, d.Parked)

	fixed.Store(true)
	mark()
	require.Equal(t, OutcomeApplied, <-settled)
	d, err = schema.DeadLetterByID(ctx, b.DB.Pool, "marked", dead[0].ID, false)
	require.NoError(t, err)
	require.NotNil(t, d.ResolvedAt)
	require.Nil(t, d.RetryRequestedAt)
	require.Equal(t, 1, b.Count(`SELECT count(*) FROM test_effects WHERE event_id = $1`, dead[0].EventID))
	err = pgx.BeginFunc(ctx, b.DB.Pool, func(tx pgx.Tx) error {
		_, err := schema.RequestDeadLetterRetryTx(ctx, tx, "marked", dead[0].ID, "ops-ada")
		return err
	})
	require.ErrorIs(t, err, schema.ErrResolved, "a resolved dead letter is not marked")
}
