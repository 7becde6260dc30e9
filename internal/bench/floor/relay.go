package floor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pending is a transaction whose publications JetStream has not all
// acknowledged yet.
type pending struct {
	end  pglogrepl.LSN
	acks []jetstream.PubAckFuture
}

func runRelay(ctx context.Context, o Options) error {
	nc, err := natsclient.Connect(o.NATSURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: o.stream(), Subjects: []string{o.outboxSubject() + ".>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		return fmt.Errorf("create the stream: %w", err)
	}
	cfg, err := pgconn.ParseConfig(o.DatabaseURL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, o.Slot, "pgoutput",
		// Temporary: the slot goes with the connection, and the database can be dropped.
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, Temporary: true}); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42710" { // duplicate_object: the slot exists
			return fmt.Errorf("create the slot: %w", err)
		}
	}
	if err := pglogrepl.StartReplication(ctx, conn, o.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names 'floor_outbox'"},
	}); err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	ready("relay", o.Slot)

	var (
		received, confirmed pglogrepl.LSN
		txn                 []jetstream.PubAckFuture
		waiting             []pending
		nextStatus          = time.Now().Add(time.Second)
	)
	// confirm moves the slot to the end of the oldest transactions whose
	// publications were all acknowledged.
	confirm := func(force bool) error {
		for len(waiting) > 0 {
			done := true
			for _, f := range waiting[0].acks {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return fmt.Errorf("publish: %w", err)
				default:
					done = false
				}
				if !done {
					break
				}
			}
			if !done {
				break
			}
			confirmed = waiting[0].end
			waiting = waiting[1:]
		}
		if !force && time.Now().Before(nextStatus) {
			return nil
		}
		nextStatus = time.Now().Add(time.Second)
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: received, WALFlushPosition: confirmed, WALApplyPosition: confirmed})
	}
	for {
		if err := confirm(false); err != nil {
			return err
		}
		recvCtx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(recvCtx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return err
		}
		msg, ok := raw.(*pgproto3.CopyData)
		if !ok || len(msg.Data) == 0 {
			continue
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return err
			}
			received = max(received, ka.ServerWALEnd)
			if ka.ReplyRequested {
				if err := confirm(true); err != nil {
					return err
				}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return err
			}
			lm, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return err
			}
			switch m := lm.(type) {
			case *pglogrepl.InsertMessage:
				// Columns: id, conversation, message_id, status.
				cols := m.Tuple.Columns
				if len(cols) < 2 {
					return fmt.Errorf("an outbox insert of %d columns", len(cols))
				}
				id, conv := string(cols[0].Data), string(cols[1].Data)
				out := natsclient.NewMsg(o.outboxSubject() + "." + conv)
				out.Header.Set(jetstream.MsgIDHeader, "outbox-"+id)
				out.Data = []byte(id + " " + conv)
				f, err := js.PublishMsgAsync(out)
				if err != nil {
					return fmt.Errorf("publish outbox row %s: %w", id, err)
				}
				txn = append(txn, f)
			case *pglogrepl.CommitMessage:
				waiting = append(waiting, pending{end: m.TransactionEndLSN, acks: txn})
				txn = nil
				received = max(received, m.TransactionEndLSN)
			}
		}
	}
}

// idOf parses an outbox row's id.
func idOf(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
