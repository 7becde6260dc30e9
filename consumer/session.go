package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/batonhq/baton/schema"
)

// Timings of the worker's session connection.
const (
	// sessionPing is how often the session's connection is checked: a
	// server that restarted, or a link that broke, is found within it
	// (plus sessionPingTimeout when nothing answers).
	sessionPing        = time.Second
	sessionPingTimeout = 3 * time.Second
	// sessionRetryMax is the longest pause between attempts to take the
	// session again. The database's grace for free locks after a restart
	// (ten seconds, migration 00018) must cover it with room to spare.
	sessionRetryMax = time.Second
)

// session keeps the worker's database session (schema.TakeWorkerSession):
// a connection of its own, outside the pool, holding the lock of the
// worker's session number for as long as the worker runs. Whenever the
// connection breaks it connects again and takes the same number's lock
// again before it reports the session held; claims and finalizes wait for
// that (await), so that no run is claimed under a session whose lock is
// free, which another worker would take over at once.
type session struct {
	cfg *pgx.ConnConfig
	log zerolog.Logger
	// heldGauge is 1 while the lock is held.
	heldGauge prometheus.Gauge
	// lost, when set, is called whenever the lock was held and is no
	// longer.
	lost func()

	mu   sync.Mutex
	id   int32
	held bool
	// changed is closed, and replaced, whenever held changes.
	changed chan struct{}
}

func newSession(pool *pgxpool.Pool, log zerolog.Logger, gauge prometheus.Gauge) *session {
	cfg := pool.Config().ConnConfig.Copy()
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > sessionPingTimeout {
		cfg.ConnectTimeout = sessionPingTimeout
	}
	return &session{cfg: cfg, log: log, heldGauge: gauge, changed: make(chan struct{})}
}

// ID is the session's number, zero until the first connection took one.
func (s *session) ID() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Held reports whether the session's lock is held now.
func (s *session) Held() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

func (s *session) set(held bool) {
	s.mu.Lock()
	if s.held == held {
		s.mu.Unlock()
		return
	}
	s.held = held
	close(s.changed)
	s.changed = make(chan struct{})
	if held {
		s.heldGauge.Set(1)
	} else {
		s.heldGauge.Set(0)
	}
	s.mu.Unlock()
	if !held && s.lost != nil {
		s.lost()
	}
}

// await waits until the lock is held, and returns the session's number;
// false when ctx ends first.
func (s *session) await(ctx context.Context) (int32, bool) {
	for {
		s.mu.Lock()
		held, id, changed := s.held, s.id, s.changed
		s.mu.Unlock()
		if held {
			return id, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// run keeps the session until ctx ends, then closes its connection, which
// releases the lock.
func (s *session) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	var logged string
	for ctx.Err() == nil {
		err := s.keep(ctx, func() {
			backoff = 100 * time.Millisecond
			logged = ""
		})
		s.set(false)
		if ctx.Err() != nil {
			return
		}
		// Once per cause until the session is held again, not at every
		// attempt: a database that stays away would fill the log.
		if err != nil && err.Error() != logged {
			logged = err.Error()
			s.log.Warn().Err(err).Int32("worker_session", s.ID()).Msg("worker session lost; claims wait until it is taken again")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, sessionRetryMax)
	}
}

// errSessionHeldElsewhere: the lock is still held by the worker's previous
// connection, which the server has not yet found gone.
var errSessionHeldElsewhere = errors.New("the session's lock is still held by this worker's previous connection")

// keep connects, takes the lock and holds it while the connection answers.
// It calls took once the lock is held.
func (s *session) keep(ctx context.Context, took func()) error {
	cctx, cancel := context.WithTimeout(ctx, sessionPingTimeout)
	conn, err := pgx.ConnectConfig(cctx, s.cfg)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	qctx, cancel := context.WithTimeout(ctx, sessionPingTimeout)
	defer cancel()
	id := s.ID()
	if id == 0 {
		if id, err = schema.NextWorkerSession(qctx, conn); err != nil {
			return err
		}
		s.mu.Lock()
		s.id = id
		s.mu.Unlock()
	}
	ok, err := schema.TakeWorkerSession(qctx, conn, id)
	if err != nil {
		return err
	}
	if !ok {
		return errSessionHeldElsewhere
	}
	s.set(true)
	took()
	s.log.Info().Int32("worker_session", id).Msg("worker session held")
	t := time.NewTicker(sessionPing)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, sessionPingTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// orphanLoop recovers, every SessionCheckInterval, the runs whose worker's
// session ended (schema.RecoverOrphanedTx): a worker that dies mid-turn
// has its conversations announced again within that, instead of after
// its lease and JetStream's ack wait.
func (w *Worker) orphanLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.SessionCheckInterval)
	defer t.Stop()
	var logged string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := w.recoverOrphaned(ctx)
		switch {
		case err == nil:
			logged = ""
		case ctx.Err() != nil:
			return
		case err.Error() != logged:
			logged = err.Error()
			w.log.Error().Err(err).Msg("recover runs of gone workers")
		}
	}
}

// recoverOrphaned recovers the runs of gone workers, in batches, each in
// one transaction with the announcement of its retried rows.
func (w *Worker) recoverOrphaned(ctx context.Context) error {
	return w.recoverBatches(ctx, schema.RecoverOrphanedTx)
}
