// Package status gathers where everything stands — the replication slot,
// the outbox stream and its consumer groups, the outbox rows and the runs
// holding leases — and says what needs an operator's attention.
package status

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/schema"
)

// Options say what to look at and when to worry.
type Options struct {
	// Slot is the relay's replication slot.
	Slot string
	// Stream is the outbox stream.
	Stream string
	// MaxLagBytes is the slot lag above which the relay needs attention.
	MaxLagBytes int64
	// MaxPendingAge is how old the oldest pending outbox row may get (the
	// sweeper's age) before it needs attention.
	MaxPendingAge time.Duration
}

// Report is everything `baton status` shows.
type Report struct {
	Slot      *Slot          `json:"slot"`
	Stream    *Stream        `json:"stream"`
	Groups    []Group        `json:"groups"`
	Outbox    Outbox         `json:"outbox"`
	Leases    Leases         `json:"leases"`
	Attention []string       `json:"attention"`
	Errors    map[string]any `json:"errors,omitempty"`
	// DeadLetters are the events consumer groups parked and nobody
	// resolved yet, by group.
	DeadLetters []DeadLetters `json:"dead_letters"`
}

// Slot is the relay's logical replication slot.
type Slot struct {
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Active            bool   `json:"active"`
	ActivePID         *int32 `json:"active_pid"`
	Client            string `json:"client,omitempty"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	WALStatus         string `json:"wal_status,omitempty"`
}

// Stream is the outbox stream's state.
type Stream struct {
	Name      string    `json:"name"`
	Messages  uint64    `json:"messages"`
	Bytes     uint64    `json:"bytes"`
	FirstSeq  uint64    `json:"first_seq"`
	FirstTime time.Time `json:"first_time"`
	LastSeq   uint64    `json:"last_seq"`
	LastTime  time.Time `json:"last_time"`
	Replicas  int       `json:"replicas"`
	Leader    string    `json:"leader,omitempty"`
	Peers     []Peer    `json:"peers,omitempty"`
}

// Peer is one replica of the stream.
type Peer struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline"`
	Lag     uint64 `json:"lag"`
}

// Group is one durable consumer on the stream.
type Group struct {
	Name         string     `json:"name"`
	Pending      uint64     `json:"pending"`
	AckPending   int        `json:"ack_pending"`
	Redelivered  int        `json:"redelivered"`
	Waiting      int        `json:"waiting"`
	LastActivity *time.Time `json:"last_activity"`
}

// Outbox counts outbox rows.
type Outbox struct {
	ByStatus         map[string]int64 `json:"by_status"`
	OldestPendingAge *Duration        `json:"oldest_pending_age"`
}

// Leases are runs holding conversations.
type Leases struct {
	Held    int64   `json:"held"`
	Expired int64   `json:"expired"`
	Runs    []Lease `json:"runs"`
}

// Lease is one run holding a conversation.
type Lease struct {
	ConversationID string    `json:"conversation_id"`
	RunID          string    `json:"run_id"`
	ExpiresAt      time.Time `json:"expires_at"`
	Worker         string    `json:"worker,omitempty"`
}

// DeadLetters counts one group's unresolved parked events.
type DeadLetters struct {
	Group string `json:"group"`
	Count int64  `json:"count"`
	// FirstSeq is the lowest stream sequence among them: a replay from it
	// delivers them all again.
	FirstSeq     int64     `json:"first_seq"`
	OldestParked time.Time `json:"oldest_parked"`
}

// Duration marshals as a Go duration string.
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Gather builds the report. js may be nil when NATS is unreachable; what
// cannot be read is reported in Errors and as needing attention.
func Gather(ctx context.Context, db schema.Executor, js jetstream.JetStream, o Options) (*Report, error) {
	r := &Report{Errors: map[string]any{}, Groups: []Group{}, Attention: []string{}, DeadLetters: []DeadLetters{}}
	if err := r.gatherSlot(ctx, db, o); err != nil {
		return nil, err
	}
	if err := r.gatherOutbox(ctx, db, o); err != nil {
		return nil, err
	}
	if err := r.gatherDeadLetters(ctx, db); err != nil {
		return nil, err
	}
	if js == nil {
		r.Errors["nats"] = "NATS is not reachable"
		r.attention("NATS is not reachable: the relay cannot publish and workers get no triggers")
	} else {
		r.gatherStream(ctx, js, o)
	}
	if len(r.Errors) == 0 {
		r.Errors = nil
	}
	return r, nil
}

func (r *Report) attention(format string, args ...any) {
	r.Attention = append(r.Attention, fmt.Sprintf(format, args...))
}

func (r *Report) gatherSlot(ctx context.Context, db schema.Executor, o Options) error {
	s := &Slot{Name: o.Slot}
	r.Slot = s
	var confirmed *string
	var walStatus *string
	var lag, retained *int64
	var client *string
	err := db.QueryRow(ctx, `
		SELECT s.active, s.active_pid, s.confirmed_flush_lsn::text, s.wal_status,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
		       (SELECT coalesce(nullif(a.application_name, ''), 'pid ' || a.pid) || coalesce(' from ' || host(a.client_addr), '')
		          FROM pg_stat_activity a WHERE a.pid = s.active_pid)
		FROM pg_replication_slots s WHERE s.slot_name = $1`, o.Slot).Scan(
		&s.Active, &s.ActivePID, &confirmed, &walStatus, &lag, &retained, &client)
	if errors.Is(err, pgx.ErrNoRows) {
		r.attention("replication slot %q does not exist: start `baton relay` (it creates the slot)", o.Slot)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read replication slot: %w", err)
	}
	s.Exists = true
	if confirmed != nil {
		s.ConfirmedFlushLSN = *confirmed
	}
	if walStatus != nil {
		s.WALStatus = *walStatus
	}
	if lag != nil {
		s.LagBytes = *lag
	}
	if retained != nil {
		s.RetainedWALBytes = *retained
	}
	if client != nil {
		s.Client = *client
	}
	if !s.Active {
		r.attention("replication slot %q is inactive: no relay is reading it (lag %s, retained WAL %s)", o.Slot, Bytes(s.LagBytes), Bytes(s.RetainedWALBytes))
	}
	if s.LagBytes > o.MaxLagBytes {
		r.attention("replication slot %q lags %s behind the WAL (threshold %s)", o.Slot, Bytes(s.LagBytes), Bytes(o.MaxLagBytes))
	}
	if s.WALStatus == "lost" || s.WALStatus == "unreserved" {
		r.attention("replication slot %q has wal_status %s: WAL it needs is gone or about to be; the relay recreates it and re-announces pending rows", o.Slot, s.WALStatus)
	}
	return nil
}

func (r *Report) gatherOutbox(ctx context.Context, db schema.Executor, o Options) error {
	r.Outbox.ByStatus = map[string]int64{"pending": 0, "processing": 0, "done": 0, "error": 0}
	rows, err := db.Query(ctx, `SELECT status, count(*) FROM agent_outbox GROUP BY status`)
	if err != nil {
		return fmt.Errorf("count outbox rows: %w", err)
	}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			rows.Close()
			return err
		}
		r.Outbox.ByStatus[st] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var age *time.Duration
	if err := db.QueryRow(ctx, `SELECT now() - min(created_at) FROM agent_outbox WHERE status = 'pending'`).Scan(&age); err != nil {
		return fmt.Errorf("oldest pending row: %w", err)
	}
	if age != nil {
		d := Duration(*age)
		r.Outbox.OldestPendingAge = &d
		if *age > o.MaxPendingAge {
			r.attention("the oldest pending outbox row is %s old (threshold %s): check the relay and the workers", age.Round(time.Second), o.MaxPendingAge)
		}
	}

	if err := db.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE lease_expires_at < now())
		FROM conversations WHERE run_id IS NOT NULL`).Scan(&r.Leases.Held, &r.Leases.Expired); err != nil {
		return fmt.Errorf("count leases: %w", err)
	}
	lrows, err := db.Query(ctx, `
		SELECT c.id, c.run_id, c.lease_expires_at, coalesce(ar.worker, '')
		FROM conversations c LEFT JOIN agent_runs ar ON ar.id = c.run_id
		WHERE c.run_id IS NOT NULL ORDER BY c.lease_expires_at LIMIT 20`)
	if err != nil {
		return fmt.Errorf("list leases: %w", err)
	}
	defer lrows.Close()
	r.Leases.Runs = []Lease{}
	for lrows.Next() {
		var l Lease
		if err := lrows.Scan(&l.ConversationID, &l.RunID, &l.ExpiresAt, &l.Worker); err != nil {
			return err
		}
		r.Leases.Runs = append(r.Leases.Runs, l)
	}
	if r.Leases.Expired > 0 {
		r.attention("%d run(s) hold expired leases: a worker died mid-turn and recovery has not run yet (is any `baton worker` running?)", r.Leases.Expired)
	}
	return lrows.Err()
}

func (r *Report) gatherStream(ctx context.Context, js jetstream.JetStream, o Options) {
	st, err := js.Stream(ctx, o.Stream)
	if err != nil {
		r.Errors["stream"] = err.Error()
		r.attention("stream %s is not available: %v", o.Stream, err)
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		r.Errors["stream"] = err.Error()
		r.attention("stream %s info: %v", o.Stream, err)
		return
	}
	s := &Stream{
		Name: info.Config.Name, Messages: info.State.Msgs, Bytes: info.State.Bytes,
		FirstSeq: info.State.FirstSeq, FirstTime: info.State.FirstTime,
		LastSeq: info.State.LastSeq, LastTime: info.State.LastTime,
		Replicas: info.Config.Replicas,
	}
	if info.Cluster != nil {
		s.Leader = info.Cluster.Leader
		if s.Leader != "" {
			s.Peers = append(s.Peers, Peer{Name: s.Leader, Current: true})
		}
		for _, p := range info.Cluster.Replicas {
			s.Peers = append(s.Peers, Peer{Name: p.Name, Current: p.Current, Offline: p.Offline, Lag: p.Lag})
			if p.Offline || !p.Current {
				r.attention("stream replica %s is %s", p.Name, map[bool]string{true: "offline", false: "behind the leader"}[p.Offline])
			}
		}
		if s.Leader == "" && s.Replicas > 1 {
			r.attention("stream %s has no leader", o.Stream)
		}
	}
	r.Stream = s
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		r.Groups = append(r.Groups, Group{
			Name: ci.Name, Pending: ci.NumPending, AckPending: ci.NumAckPending,
			Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting, LastActivity: ci.Delivered.Last,
		})
	}
	if err := lister.Err(); err != nil {
		r.Errors["groups"] = err.Error()
	}
	sort.Slice(r.Groups, func(i, j int) bool { return r.Groups[i].Name < r.Groups[j].Name })
}

// Bytes formats a byte count for people.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// gatherDeadLetters counts parked events by group. A database migrated
// before consumer groups existed has no such table: nothing is parked.
func (r *Report) gatherDeadLetters(ctx context.Context, db schema.Executor) error {
	rows, err := db.Query(ctx, `
		SELECT group_name, count(*), min(stream_seq), min(parked_at)
		FROM group_dead_letters WHERE resolved_at IS NULL
		GROUP BY group_name ORDER BY group_name`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("count dead letters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d DeadLetters
		if err := rows.Scan(&d.Group, &d.Count, &d.FirstSeq, &d.OldestParked); err != nil {
			return err
		}
		r.DeadLetters = append(r.DeadLetters, d)
		r.attention("group %s parked %d event(s) in group_dead_letters: fix the cause, then `baton replay --group %s --from-seq %d`", d.Group, d.Count, d.Group, d.FirstSeq)
	}
	return rows.Err()
}
