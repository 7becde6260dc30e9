package schema_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/migrations"
	"github.com/batonhq/baton/schema"
)

// Run only with -bench (`make bench` runs it with the others and prints
// one table):
//
//	go test -run '^$' -bench BenchmarkProducer -benchtime 1x ./schema/

const (
	producerClients       = 8
	producerConversations = 64
	producerMessages      = 4000 // per variant and round
	producerRounds        = 3
)

// BenchmarkProducer measures what a user message costs its producer on a
// durable PostgreSQL (fsync and synchronous commit on), each message in a
// transaction of its own, 8 producers at once over 64 conversations:
// through the SQL producer's baton_send_message (a user by name, as a
// backend in any language calls it), through schema.InsertMessageTx (the
// API's path, the same function for an owner the API has found), and,
// as the reference, through the statements InsertMessageTx ran before the
// functions existed (insertByStatements, kept here as they were). The
// variants take turns, three rounds of 4,000 messages each, after a round
// that warms every connection's plans; the figures are their totals.
func BenchmarkProducer(b *testing.B) {
	for range b.N {
		producerOnce(b)
	}
}

// producerVariant stores one message in tx.
type producerVariant struct {
	name string
	send func(ctx context.Context, tx pgx.Tx, owner int64, user, conversation, message string) error
}

func producerOnce(b *testing.B) {
	ctx := context.Background()
	pg := bench.StartPostgres(b, nil)
	db := pg.Database(b)
	if _, err := migrations.Up(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, bench.WithParams(db.URL, fmt.Sprintf("pool_max_conns=%d", producerClients)))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for i := range producerConversations {
		if _, err := pool.Exec(ctx, `SELECT * FROM baton_create_conversation('alice', $1, '')`, fmt.Sprintf("conv-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	owner := db.Count(b, `SELECT id FROM users WHERE name = 'alice'`)

	variants := []producerVariant{
		{"statements", func(ctx context.Context, tx pgx.Tx, owner int64, _, conversation, message string) error {
			return insertByStatements(ctx, tx, owner, conversation, message, "hello")
		}},
		{"InsertMessageTx", func(ctx context.Context, tx pgx.Tx, owner int64, _, conversation, message string) error {
			_, err := schema.InsertMessageTx(ctx, tx, schema.UserMessage{OwnerID: owner, ConversationID: conversation, MessageID: message, Content: "hello"})
			return err
		}},
		{"baton_send_message", func(ctx context.Context, tx pgx.Tx, _ int64, user, conversation, message string) error {
			_, err := tx.Exec(ctx, `SELECT * FROM baton_send_message($1, $2, $3, $4)`, user, conversation, message, "hello")
			return err
		}},
	}
	wall := map[string]time.Duration{}
	cpu := map[string]time.Duration{}
	for round := 0; round <= producerRounds; round++ {
		for i := range variants {
			v := variants[(i+round)%len(variants)] // each goes first once
			before := db.BackendCPU(b)
			took := produce(b, pool, v, owner, fmt.Sprintf("r%d", round))
			used := bench.CPUSince(db.BackendCPU(b), before)
			if round == 0 {
				continue // warming up
			}
			wall[v.name] += took
			cpu[v.name] += used
		}
	}
	total := producerRounds * producerMessages
	if n := db.Count(b, `SELECT count(*) FROM agent_outbox`); n != int64((producerRounds+1)*producerMessages*len(variants)) {
		b.Fatalf("%d outbox rows, want one per message", n)
	}
	perMessage := func(d time.Duration) time.Duration { return d / time.Duration(total) }
	rate := func(d time.Duration) string { return bench.Thousands(float64(total)/d.Seconds()) + " messages/s" }
	ref := wall["statements"]
	for _, f := range []struct{ id, variant, what string }{
		{"6a", "baton_send_message", "SQL producer, baton_send_message (a user by name)"},
		{"6b", "InsertMessageTx", "Go producer and API, InsertMessageTx (the same function, for an owner)"},
	} {
		ratio := float64(wall[f.variant]) / float64(ref)
		b.Logf("%s: %s, %s of wall time and %s of server processor time a message", f.variant, rate(wall[f.variant]), perMessage(wall[f.variant]), perMessage(cpu[f.variant]))
		bench.Record(b, bench.Figure{ID: f.id,
			Name:      fmt.Sprintf("producer time per message, %s; %d producers at once, a transaction each, durable commits", f.what, producerClients),
			Value:     fmt.Sprintf("%s (%s)", bench.Ms(perMessage(wall[f.variant])), rate(wall[f.variant])),
			Reference: fmt.Sprintf("%s (%s), the statements of before", bench.Ms(perMessage(ref)), rate(ref)),
			Ratio:     ratio, Aim: "at most 1.10", Met: bench.Verdict(ratio <= 1.10)})
	}
	b.Logf("statements: %s, %s of wall time and %s of server processor time a message", rate(ref), perMessage(ref), perMessage(cpu["statements"]))
	bench.Record(b, bench.Figure{ID: "6c",
		Name:      "server processor time per message, SQL producer (baton_send_message)",
		Value:     perMessage(cpu["baton_send_message"]).String(),
		Reference: perMessage(cpu["statements"]).String() + ", the statements of before",
		Ratio:     float64(cpu["baton_send_message"]) / float64(cpu["statements"])})
}

// produce stores producerMessages messages with v, from producerClients
// goroutines, and returns how long it took.
func produce(b *testing.B, pool *pgxpool.Pool, v producerVariant, owner int64, round string) time.Duration {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, producerClients)
	start := time.Now()
	for c := range producerClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < producerMessages; i += producerClients {
				conversation := fmt.Sprintf("conv-%d", i%producerConversations)
				message := fmt.Sprintf("%s-%s-%d", v.name, round, i)
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return v.send(ctx, tx, owner, "alice", conversation, message)
				}); err != nil {
					errs <- fmt.Errorf("%s: %w", v.name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}

// insertByStatements is how InsertMessageTx stored a new message before
// the producer's SQL functions: the conversation locked, the message, its
// outbox row and the conversation's metadata, four statements from Go,
// with the keys chosen in Go. (The read of an existing message, which a
// new message never reaches, is left out.)
func insertByStatements(ctx context.Context, tx pgx.Tx, ownerID int64, conversationID, messageID, content string) error {
	var conversationKey, messageKey string
	var seq, outboxID int64
	var createdAt time.Time
	err := tx.QueryRow(ctx, `
		SELECT id FROM conversations WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`,
		ownerID, conversationID).Scan(&conversationKey)
	if err != nil {
		return fmt.Errorf("lock conversation: %w", err)
	}
	err = tx.QueryRow(ctx, `
		INSERT INTO messages (id, public_id, owner_id, conversation_id, role, content)
		VALUES ($1, $2, $3, $4, 'user', $5)
		ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
		RETURNING id, seq, created_at`, "m_"+uuid.Must(uuid.NewV7()).String(), messageID, ownerID, conversationKey, content).
		Scan(&messageKey, &seq, &createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.New("the message exists")
	}
	if err != nil {
		return fmt.Errorf("insert message: %w", err)
	}
	if err := tx.QueryRow(ctx, `
		INSERT INTO agent_outbox (conversation_id, message_id, trace_parent) VALUES ($1, $2, NULLIF($3, ''))
		RETURNING id`, conversationKey, messageKey, "").Scan(&outboxID); err != nil {
		return fmt.Errorf("insert outbox row: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations
		SET updated_at = now(), last_message_at = now()
		WHERE id = $1`, conversationKey); err != nil {
		return fmt.Errorf("touch conversation: %w", err)
	}
	return nil
}
