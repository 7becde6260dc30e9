package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	natsclient "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/internal/telemetry"
	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// session is one replication connection, from START_REPLICATION to its end.
type session struct {
	r       *Relay
	conn    *pgconn.PgConn
	pub     *publisher
	events  *eventBuilder
	tracker *tracker
	decoder *outboxDecoder
	// published counts acknowledged events by reason, without a label
	// lookup per event.
	published map[batonnats.Reason]prometheus.Counter

	cur        *txn          // the transaction being decoded
	received   pglogrepl.LSN // highest WAL position received
	reported   pglogrepl.LSN // last confirmed position sent
	nextStatus time.Time
	cancel     <-chan struct{} // the session's context's Done
}

// session opens the slot and streams until an error or the end of ctx.
// streamed reports whether it got as far as streaming.
func (r *Relay) session(ctx context.Context, standby *bool) (streamed bool, err error) {
	if !r.nc.IsConnected() {
		return false, errNATSDown
	}
	// The relay owns the outbox stream: it alone creates it and changes
	// its settings, and says so when it does.
	_, changes, err := batonnats.ProvisionStream(ctx, r.api, r.cfg.Stream, batonnats.ProvisionOptions{AllowShrink: r.cfg.AllowRetentionShrink})
	var shrink *batonnats.ShrinkError
	if errors.As(err, &shrink) {
		return false, &fatalError{err}
	}
	if err != nil {
		return false, err
	}
	for _, c := range changes {
		r.log.Warn().Str("stream", r.cfg.Stream.Name).Str("setting", c.Setting).Str("from", c.Old).Str("to", c.New).Msg("changed a setting of the outbox stream")
	}
	if err := r.ensurePublication(ctx); err != nil {
		return false, err
	}
	if err := r.ensureSlot(ctx); err != nil {
		return false, err
	}

	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, err := pgconn.ConnectConfig(connectCtx, r.repl)
	cancel()
	if err != nil {
		return false, fmt.Errorf("open replication connection: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + r.cfg.Publication + "'",
			"messages 'true'",
		},
	})
	if pgCode(err) == pgObjectInUse {
		return false, errSlotActive
	}
	if err != nil {
		return false, fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}
	// Read the slot's position only now that this relay holds it: nobody
	// else can move it any more.
	slot, err := r.inspectSlot(ctx)
	if err != nil {
		return false, err
	}
	if *standby {
		r.log.Info().Str("slot", r.cfg.Slot).Str("confirmed_lsn", slot.confirmed.String()).Msg("took over the slot")
		*standby = false
	} else {
		r.log.Info().Str("slot", r.cfg.Slot).Str("confirmed_lsn", slot.confirmed.String()).Msg("connected; streaming")
	}
	r.active.Store(true)
	r.metrics.active.Set(1)
	r.metrics.confirmedLSN.Set(float64(slot.confirmed))

	s := &session{
		r:          r,
		conn:       conn,
		tracker:    newTracker(slot.confirmed),
		decoder:    newOutboxDecoder(),
		published:  map[batonnats.Reason]prometheus.Counter{},
		reported:   slot.confirmed,
		received:   slot.confirmed,
		nextStatus: time.Now().Add(r.cfg.StatusInterval),
		cancel:     ctx.Done(),
		events:     newEventBuilder(r.cfg.Stream.SubjectPrefix, r.cfg.Stream.Partitions),
	}
	for _, reason := range []batonnats.Reason{batonnats.ReasonInsert, batonnats.ReasonRetry, batonnats.ReasonUserRetry, batonnats.ReasonSweep} {
		s.published[reason] = r.metrics.published.WithLabelValues(string(reason))
	}
	rebuild := func(t *batonnats.Trigger) (*natsclient.Msg, error) {
		return eventMsg(t, r.cfg.Stream.SubjectPrefix, r.cfg.Stream.Partitions)
	}
	// A failed publication interrupts the read of the replication stream,
	// so the session restarts without waiting for WAL or a status update.
	s.pub, err = newPublisher(r.nc, r.cfg.MaxInFlight, r.cfg.AckTimeout, rebuild, s.acked, func() {
		r.metrics.publishErrors.Inc()
		s.interrupt()
	})
	if err != nil {
		return true, err
	}
	defer func() {
		s.pub.close()
		r.metrics.inFlight.Set(0)
	}()

	err = s.receive(ctx)
	if ctx.Err() == nil {
		return true, err
	}
	// Shutting down: stop reading, let the events in flight be
	// acknowledged (or time out), and confirm what was.
	select {
	case <-s.pub.drained():
	case <-s.pub.failed:
	case <-time.After(r.cfg.AckTimeout + time.Second):
	}
	if err := s.sendStatus(); err != nil {
		r.log.Warn().Err(err).Msg("final status update failed; the slot resends from its last position")
	} else {
		r.log.Info().Str("confirmed_lsn", s.reported.String()).Msg("stopped; confirmed what JetStream acknowledged")
	}
	return true, nil
}

// interrupt makes a read of the replication stream in progress (or the
// next one) return at once with a timeout. The read loop then looks at the
// context and the publisher before it reads again.
func (s *session) interrupt() {
	_ = s.conn.Conn().SetReadDeadline(time.Now())
}

// receive reads the replication stream until an error or ctx ends.
//
// Reads wait under a deadline on the connection itself, the next status
// update, rather than under a context of their own: a context per message
// costs a timer, and a cancellation callback registered and removed, at
// tens of thousands of messages per second. The end of ctx and a failed publication interrupt
// the read instead. Each sets the deadline after its own state is visible,
// and the loop checks that state after it sets a deadline, so one of the
// two always sees the other.
func (s *session) receive(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.interrupt)
	defer stop()
	var deadline time.Time // the read deadline this loop last set
	for {
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(); err != nil {
				return err
			}
		}
		if !deadline.Equal(s.nextStatus) {
			deadline = s.nextStatus
			if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("receive from slot %s: %w", s.r.cfg.Slot, err)
			}
		}
		select {
		case <-s.pub.failed:
			return s.pub.err
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				// The deadline passed or was moved by an interruption:
				// set it again.
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("receive from slot %s: %w", s.r.cfg.Slot, err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := s.copyData(ctx, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("slot %s: %w", s.r.cfg.Slot, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("slot %s: the server ended the stream", s.r.cfg.Slot)
		default:
			// Notices and parameter updates need no answer.
		}
	}
}

func (s *session) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty CopyData", ErrMalformed)
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if s.cur == nil {
			// Everything up to the server's end of WAL has been sent before
			// this keepalive, and no transaction is open: like a heartbeat,
			// the position can be confirmed once every event before it is
			// acknowledged. Without this, a fast shutdown of PostgreSQL
			// waits forever for the relay to confirm the shutdown
			// checkpoint, which no outbox event or heartbeat follows.
			s.tracker.commit(s.tracker.begin(time.Time{}), ka.ServerWALEnd)
		}
		if ka.ReplyRequested {
			// The server is about to give up on this connection, or is
			// shutting down and waits for the confirmation.
			return s.sendStatus()
		}
		return nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		s.received = max(s.received, x.WALStart)
		return s.handle(ctx, x.WALData)
	default:
		return nil
	}
}

// handle acts on one pgoutput message.
func (s *session) handle(ctx context.Context, data []byte) error {
	m, err := parseWALMessage(data)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case beginMessage:
		if s.cur != nil {
			return fmt.Errorf("%w: begin inside a transaction", ErrMalformed)
		}
		s.cur = s.tracker.begin(m.CommitTime)
	case commitMessage:
		if s.cur == nil {
			return fmt.Errorf("%w: commit outside a transaction", ErrMalformed)
		}
		s.tracker.commit(s.cur, m.EndLSN)
		s.cur = nil
	case relationMessage:
		return s.decoder.relation(m)
	case insertMessage:
		if s.cur == nil {
			return fmt.Errorf("%w: insert outside a transaction", ErrMalformed)
		}
		t, ok, err := s.decoder.trigger(m)
		if err != nil || !ok {
			return err
		}
		return s.publish(ctx, s.cur, t)
	case logicalMessage:
		return s.logical(ctx, m)
	}
	return nil
}

func (s *session) logical(ctx context.Context, m logicalMessage) error {
	switch m.Prefix {
	case schema.AnnouncePrefix:
		a, err := schema.ParseAnnouncement(m.Content)
		if err != nil {
			// Retrying cannot repair a committed payload; the sweeper
			// announces the rows again if they stay pending.
			s.r.log.Error().Err(err).Str("lsn", m.LSN.String()).Msg("skipping an announcement that cannot be decoded")
			return nil
		}
		x := s.cur
		if x == nil {
			x = s.tracker.begin(time.Now())
		}
		for _, t := range a.Triggers {
			if t.Reason == "" {
				t.Reason = a.Reason
			}
			if t.OutboxID <= 0 || t.ConversationID == "" {
				s.r.log.Error().Int64("outbox_id", t.OutboxID).Msg("skipping an announced trigger without outbox or conversation id")
				continue
			}
			if err := s.publish(ctx, x, t); err != nil {
				return err
			}
		}
		if s.cur == nil {
			s.tracker.commit(x, m.LSN)
		}
	case schema.HeartbeatPrefix:
		if s.cur == nil {
			// Nothing of the outbox lies between the last transaction and
			// the heartbeat: once everything before it is acknowledged,
			// its position can be confirmed.
			s.tracker.commit(s.tracker.begin(time.Time{}), m.LSN)
		}
	}
	return nil
}

// publish sends one event, blocking while MaxInFlight events are
// unacknowledged. The publisher reports its acknowledgement to acked.
func (s *session) publish(ctx context.Context, x *txn, t batonnats.Trigger) error {
	// A row written within a trace gets a publish span in it, and the
	// message carries the span on as its trace context. Rows without one
	// cost nothing here.
	var span trace.Span
	if t.TraceParent != "" {
		var sctx context.Context
		sctx, span = telemetry.Tracer().Start(telemetry.FromTraceParent(ctx, t.TraceParent), "relay publish",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.Int64("baton.outbox_id", t.OutboxID), attribute.String("baton.reason", string(t.Reason))))
		if tp := telemetry.TraceParent(sctx); tp != "" {
			t.TraceParent = tp
		}
	}
	msg, err := s.events.build(&t)
	if err != nil {
		return err
	}
	select {
	case <-s.pub.failed:
		return s.pub.err
	default:
	}
	// Counted before it is sent: the acknowledgement can arrive before
	// PublishMsg returns. If the publication fails the session ends, and
	// an event counted but never sent only holds the confirmed LSN back.
	s.tracker.add(x)
	s.r.metrics.inFlight.Inc()
	if err := s.pub.publish(msg, x, &t, span, s.cancel); err != nil {
		var send sendError
		switch {
		case errors.Is(err, errPublishCancelled):
			return ctx.Err()
		case errors.As(err, &send):
			s.r.metrics.publishErrors.Inc()
			return fmt.Errorf("publish outbox row %d: %w", t.OutboxID, send.err)
		}
		return err
	}
	return nil
}

// acked counts one event as stored by JetStream. It runs on the NATS
// connection's delivery goroutine, in the order acknowledgements arrive;
// the tracker confirms a transaction only when all its events and all
// those before it are acknowledged, whatever that order.
func (s *session) acked(ev *inflight, now time.Time) {
	if ev.span != nil {
		ev.span.End()
	}
	m := s.r.metrics
	s.tracker.acked(ev.txn)
	m.inFlight.Dec()
	if c, ok := s.published[ev.trigger.Reason]; ok {
		c.Inc()
	} else {
		m.published.WithLabelValues(string(ev.trigger.Reason)).Inc()
	}
	if !ev.txn.commitTime.IsZero() {
		m.ackLatency.Observe(now.Sub(ev.txn.commitTime).Seconds())
	}
	if s.r.onAck != nil {
		s.r.onAck(ev.trigger, ev.txn.commitTime, now)
	}
}

// sendStatus reports the confirmed position. Write is what was received;
// flush and apply are what JetStream acknowledged, which is all the slot
// uses: PostgreSQL may drop WAL before it.
func (s *session) sendStatus() error {
	confirmed := s.tracker.Confirmed()
	if confirmed < s.reported {
		confirmed = s.reported // never backwards
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: max(s.received, confirmed),
		WALFlushPosition: confirmed,
		WALApplyPosition: confirmed,
	})
	s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
	if err != nil {
		return fmt.Errorf("send status update to slot %s: %w", s.r.cfg.Slot, err)
	}
	if confirmed != s.reported {
		s.r.log.Debug().Str("confirmed_lsn", confirmed.String()).Msg("confirmed")
	}
	s.reported = confirmed
	s.r.metrics.confirmedLSN.Set(float64(confirmed))
	return nil
}
