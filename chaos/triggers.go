package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	batonnats "github.com/batonhq/baton/nats"
)

// TriggerAudit compares the triggers left in the outbox stream at the end
// of a run (those since the stream was last wiped) with the database.
// A trigger can outlive its row without harm: the claim takes only rows
// that exist and are pending. Figures, not invariants.
type TriggerAudit struct {
	// Read is how many triggers the stream held.
	Read int
	// Lost are triggers of rows that no surviving primary ever had: the
	// relay published them from WAL that died with a primary killed
	// before its standby had it (commits never acknowledged to anyone).
	Lost int
	// Reused are first announcements ("outbox-<id>") whose outbox id the
	// database now gives to another message: a promoted standby handed the
	// id out again. While the first one is in JetStream's duplicate window,
	// the new row's own first announcement is dropped as a duplicate, and
	// only a later announcement (the sweeper's) starts its turn.
	Reused int
	// Swallowed are the reused ids whose row in the database has no first
	// announcement of its own in the stream: JetStream dropped it as a
	// duplicate of the other message's.
	Swallowed int
	// Examples name a dozen of them at most.
	Examples []string
	// Err is why the stream could not be read, if it could not.
	Err string
}

func (a TriggerAudit) String() string {
	if a.Err != "" {
		return "not read: " + a.Err
	}
	return fmt.Sprintf("%d read; %d of rows lost with a killed primary; %d first announcements whose outbox id now names another message (%d of those rows' own first announcements dropped as duplicates)",
		a.Read, a.Lost, a.Reused, a.Swallowed)
}

// auditTriggers reads every trigger of the outbox stream and compares it
// with the outbox rows, trying again for 30 seconds while the stream
// cannot be read (a NATS node still electing leaders).
func (s *system) auditTriggers(ctx context.Context, pool *pgxpool.Pool) TriggerAudit {
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := s.readTriggers(ctx, pool)
		if err == nil {
			return a
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			a.Err = err.Error()
			return a
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *system) readTriggers(ctx context.Context, pool *pgxpool.Pool) (TriggerAudit, error) {
	var a TriggerAudit
	rows := map[int64]string{} // outbox id -> message id
	conversations := map[string]bool{}
	if err := eachRow(ctx, pool, `SELECT id::text, message_id FROM agent_outbox`, func(r []string) {
		var id int64
		fmt.Sscan(r[0], &id)
		rows[id] = r[1]
	}); err != nil {
		return a, err
	}
	if err := eachRow(ctx, pool, `SELECT id FROM conversations`, func(r []string) { conversations[r[0]] = true }); err != nil {
		return a, err
	}
	reused := map[int64]bool{}
	announced := map[int64]bool{} // first announcements that match the database
	err := s.eachTrigger(ctx, func(t batonnats.Trigger) {
		a.Read++
		a.judge(t, rows, conversations)
		if m, ok := rows[t.OutboxID]; ok && t.Announcement == "" {
			if m == t.MessageID {
				announced[t.OutboxID] = true
			} else {
				reused[t.OutboxID] = true
			}
		}
	})
	for id := range reused {
		if !announced[id] {
			a.Swallowed++
		}
	}
	return a, err
}

// eachTrigger reads the outbox stream from its first message to its last.
func (s *system) eachTrigger(ctx context.Context, fn func(batonnats.Trigger)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	nc, err := natsclient.Connect(s.natsURL, natsclient.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, streamName)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	last := info.State.LastSeq
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return err
	}
	read := 0
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			read++
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			if t, err := batonnats.ParseTrigger(msg.Data()); err == nil {
				fn(t)
			}
			if meta.Sequence.Stream >= last {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return err
		}
		if got == 0 {
			return fmt.Errorf("the stream ends at %d but nothing came after %d messages", last, read)
		}
	}
}

func (a *TriggerAudit) judge(t batonnats.Trigger, rows map[int64]string, conversations map[string]bool) {
	message, ok := rows[t.OutboxID]
	switch {
	case ok && message == t.MessageID:
	case ok:
		if t.Announcement == "" {
			a.Reused++
			if len(a.Examples) < 12 {
				a.Examples = append(a.Examples, fmt.Sprintf("%s announced message %s of conversation %s; outbox %d is now message %s", t.MsgID(), t.MessageID, t.ConversationID, t.OutboxID, message))
			}
		}
	case !conversations[t.ConversationID]:
		// Deleted with its conversation.
	default:
		a.Lost++
		if len(a.Examples) < 12 {
			a.Examples = append(a.Examples, fmt.Sprintf("%s announced message %s of conversation %s, which no surviving primary has", t.MsgID(), t.MessageID, t.ConversationID))
		}
	}
}
