package floor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type worker struct {
	o      Options
	pool   *pgxpool.Pool
	nc     *natsclient.Conn
	client *http.Client
}

func runWorker(ctx context.Context, o Options) error {
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := natsclient.Connect(o.NATSURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, o.stream())
	if err != nil {
		return fmt.Errorf("the relay creates the stream: %w", err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: o.Prefix + "_worker", AckPolicy: jetstream.AckExplicitPolicy,
		// Every turn in flight holds its trigger unacknowledged.
		MaxAckPending: 100_000,
	})
	if err != nil {
		return err
	}
	w := &worker{o: o, pool: pool, nc: nc, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}}
	var turns sync.WaitGroup
	cc, err := cons.Consume(func(m jetstream.Msg) {
		turns.Go(func() { w.turn(ctx, m) })
	})
	if err != nil {
		return err
	}
	ready("worker", o.Prefix)
	<-ctx.Done()
	cc.Stop()
	turns.Wait()
	return ctx.Err()
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// turn runs one trigger's turn: claim, model, finalize, ack. A failure
// leaves the trigger unacknowledged; the chain retries nothing.
func (w *worker) turn(ctx context.Context, m jetstream.Msg) {
	if err := w.run(ctx, m); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "floor worker: %s: %v\n", m.Data(), err)
	}
}

func (w *worker) run(ctx context.Context, m jetstream.Msg) error {
	idText, conv, _ := strings.Cut(string(m.Data()), " ")
	id, err := idOf(idText)
	if err != nil {
		_ = m.Term()
		return err
	}
	// One claim statement: the row claimed, the conversation's history read.
	rows, err := w.pool.Query(ctx, `WITH c AS (
		UPDATE floor_outbox SET status = 'claimed' WHERE id = $1 AND status = 'pending' RETURNING conversation)
	SELECT role, content FROM floor_messages WHERE conversation = (SELECT conversation FROM c) ORDER BY seq`, id)
	if err != nil {
		return err
	}
	history, err := pgx.CollectRows(rows, pgx.RowToStructByPos[chatMessage])
	if err != nil {
		return err
	}
	if len(history) == 0 {
		// A commit is streamed once its WAL is flushed, a moment before
		// other sessions see it: a row not there yet is claimed on the
		// redelivery; a row claimed before is not.
		var status string
		err := w.pool.QueryRow(ctx, `SELECT status FROM floor_outbox WHERE id = $1`, id).Scan(&status)
		if err == nil && status != "pending" {
			_ = m.Ack()
		} else {
			_ = m.Nak()
		}
		return nil
	}
	reply, err := w.model(ctx, conv, history)
	if err != nil {
		return err
	}
	replyID := fmt.Sprintf("reply-%d", id)
	// One transaction: the reply, and the row done.
	if _, err := w.pool.Exec(ctx, `WITH r AS (
		INSERT INTO floor_messages (conversation, id, role, content) VALUES ($1, $2, 'assistant', $3))
	UPDATE floor_outbox SET status = 'done' WHERE id = $4`, conv, replyID, reply, id); err != nil {
		return err
	}
	ev, _ := json.Marshal(map[string]string{"type": "replied", "message_id": replyID})
	if err := w.nc.Publish(w.o.conversationSubject(conv)+".events", ev); err != nil {
		return err
	}
	return m.Ack()
}

// model streams a chat completion, publishing each token on NATS core as
// it arrives, and returns the whole reply.
func (w *worker) model(ctx context.Context, conv string, history []chatMessage) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": "floor", "stream": true, "messages": history})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.o.ModelURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := w.client.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("model: status %d", res.StatusCode)
	}
	live := w.o.conversationSubject(conv) + ".live"
	var reply strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &chunk) != nil || len(chunk.Choices) == 0 || chunk.Choices[0].Delta.Content == "" {
			continue
		}
		text := chunk.Choices[0].Delta.Content
		reply.WriteString(text)
		delta, _ := json.Marshal(map[string]string{"type": "delta", "text": text})
		_ = w.nc.Publish(live, delta)
	}
	return reply.String(), sc.Err()
}
