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

	batonnats "github.com/batonhq/baton/nats"
	"github.com/batonhq/baton/schema"
)

// Defaults of the checks that wait before they worry.
const (
	// DefaultStallAfter is how long a slot's confirmed position may stand
	// still while WAL waits behind it, and a consumer may go without an
	// acknowledgement while events wait for it.
	DefaultStallAfter = 5 * time.Minute
	// DefaultLeaseGrace is how long past its expiry a lease may stay held
	// before it needs attention: workers recover expired leases every half
	// lease, and at once when a trigger of the conversation comes.
	DefaultLeaseGrace = time.Minute
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
	// StallAfter is how long the slot's confirmed position may stand still
	// while WAL waits behind it, how long a durable consumer of the stream
	// may go without an acknowledgement while events have waited for it,
	// and how long an external agent may fail every step request while
	// workers keep sending them, before any of them needs attention.
	// Defaults to 5 minutes.
	StallAfter time.Duration
	// LeaseGrace is how long past its expiry a run may hold a
	// conversation's lease before it needs attention. Defaults to 1 minute.
	LeaseGrace time.Duration
	// NoScans leaves out what reads a whole table or index: the outbox
	// rows by status (only pending rows are counted, from their partial
	// index) and the tables' sizes. The console sets it: it gathers the
	// report every few seconds.
	NoScans bool
}

// WithDefaults returns a copy of o with every zero duration set to its
// default.
func (o Options) WithDefaults() Options {
	if o.StallAfter == 0 {
		o.StallAfter = DefaultStallAfter
	}
	if o.LeaseGrace == 0 {
		o.LeaseGrace = DefaultLeaseGrace
	}
	return o
}

// Report is everything `baton status` shows.
type Report struct {
	Database  *Database      `json:"database"`
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
	// Tables are the sizes and oldest rows of the tables that grow with
	// use; retention (`baton prune`) keeps four of them in check.
	Tables []schema.TableStat `json:"tables"`
	// SignIn is which tokens the API accepts; nil when not asked.
	SignIn *SignIn `json:"sign_in,omitempty"`
	// MCPServers are the MCP servers the workers listed, with their tools,
	// each tool's effect, whether its definition changed since it was
	// accepted (then it is not offered), and when it was last listed.
	MCPServers []schema.MCPServerRecord `json:"mcp_servers"`
	// ApprovalsWaiting counts the calls that wait for their user's
	// approval.
	ApprovalsWaiting int `json:"approvals_waiting"`
	// Agents are the external agents the workers sent steps to (--agent
	// ag-ui or ai-sdk), each with whether its latest step request got an
	// answer, since when, and its last error.
	Agents []schema.AgentEndpoint `json:"agents"`
}

// Database is the PostgreSQL server the report was read from: the
// primary, which after a failover is the promoted standby.
type Database struct {
	Name string `json:"name"`
	// Server is the address of the server reached ("host:port"), which
	// tells which one of a multi-host URL's servers is the primary.
	Server string `json:"server"`
	// Timeline grows by one at each promotion.
	Timeline int64 `json:"timeline"`
	// SynchronousStandbyNames is the server's setting: commits wait for
	// the standbys it names.
	SynchronousStandbyNames string `json:"synchronous_standby_names,omitempty"`
	// Standbys are the streaming (physical) replicas connected to it.
	Standbys []Standby `json:"standbys"`
}

// Standby is a physical replica streaming from the primary.
type Standby struct {
	Name      string `json:"name"`
	Client    string `json:"client,omitempty"`
	State     string `json:"state"`
	SyncState string `json:"sync_state"`
	// ReplayLagBytes is the WAL the standby has not replayed yet.
	ReplayLagBytes int64 `json:"replay_lag_bytes"`
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
	// ProgressedAt is the latest time a relay saw the confirmed position
	// move, or no WAL behind it (table relay_slot_progress, written at each
	// relay heartbeat); nil when no relay has recorded it.
	ProgressedAt *time.Time `json:"progressed_at,omitempty"`
	// ObservedAt is when a relay last recorded the slot; relays do at
	// each heartbeat, streaming or standing by.
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	// StalledFor is how long the confirmed position has stood still while
	// WAL waited behind it; zero while it moves or nothing waits.
	StalledFor Duration `json:"stalled_for"`
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

// Group is one durable consumer on the stream: Baton's turn runner, a
// consumer group, or anyone else's.
type Group struct {
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
	// Waiting counts the pull requests waiting for events: zero while
	// nobody reads the consumer.
	Waiting int `json:"waiting"`
	// LastActivity is the last delivery.
	LastActivity *time.Time `json:"last_activity"`
	// LastAck is the last acknowledgement the server saw since it started
	// (nil before the first).
	LastAck *time.Time `json:"last_ack"`
	// OldestWaiting is when the stream stored the oldest event the consumer
	// has not acknowledged; nil when nothing waits.
	OldestWaiting *time.Time `json:"oldest_waiting,omitempty"`
	// StalledFor is how long events have waited with no acknowledgement:
	// the lesser of the oldest waiting event's age and the time since the
	// last acknowledgement; zero when nothing waits.
	StalledFor Duration `json:"stalled_for"`
}

// Outbox counts outbox rows.
type Outbox struct {
	ByStatus         map[string]int64 `json:"by_status"`
	OldestPendingAge *Duration        `json:"oldest_pending_age"`
}

// Leases are runs holding conversations.
type Leases struct {
	Held    int64 `json:"held"`
	Expired int64 `json:"expired"`
	// Overdue are the expired leases still held past the grace period
	// (Options.LeaseGrace): nobody recovers them.
	Overdue int64   `json:"overdue"`
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

// ErrStandby is the error of Gather on a server that is in recovery.
var ErrStandby = errors.New("the database server is a standby (in recovery)")

// Gather builds the report. js may be nil when NATS is unreachable; what
// cannot be read is reported in Errors and as needing attention. A server
// in recovery is ErrStandby: the slot and the outbox live on the primary.
func Gather(ctx context.Context, db schema.Executor, js jetstream.JetStream, o Options) (*Report, error) {
	o = o.WithDefaults()
	r := &Report{Errors: map[string]any{}, Groups: []Group{}, Attention: []string{}, DeadLetters: []DeadLetters{}, Tables: []schema.TableStat{}, MCPServers: []schema.MCPServerRecord{}, Agents: []schema.AgentEndpoint{}}
	if err := r.gatherDatabase(ctx, db); err != nil {
		return nil, err
	}
	if err := r.gatherSlot(ctx, db, o); err != nil {
		return nil, err
	}
	if err := r.gatherOutbox(ctx, db, o); err != nil {
		return nil, err
	}
	if err := r.gatherDeadLetters(ctx, db); err != nil {
		return nil, err
	}
	if !o.NoScans {
		r.gatherTables(ctx, db)
	}
	if err := r.gatherMCP(ctx, db); err != nil {
		return nil, err
	}
	if err := r.gatherAgents(ctx, db, o); err != nil {
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

// gatherMCP lists the MCP servers and tools the workers recorded, and the
// approvals that wait. A tool whose definition changed needs an
// operator: it is not offered until accepted.
func (r *Report) gatherMCP(ctx context.Context, db schema.Executor) error {
	servers, err := schema.ListMCPServers(ctx, db)
	if err != nil {
		return err
	}
	r.MCPServers = servers
	for _, s := range servers {
		for _, t := range s.Tools {
			if t.Changed {
				r.attention("MCP tool %s__%s changed its definition: it is not offered until `baton mcp accept %s__%s`", s.Server, t.Tool, s.Server, t.Tool)
			}
		}
	}
	return db.QueryRow(ctx, `SELECT count(*) FROM approvals WHERE status = 'pending'`).Scan(&r.ApprovalsWaiting)
}

// gatherAgents lists the external agents the workers recorded. One that
// has failed every request for StallAfter while workers still send it
// steps (its last error is more recent than that) needs an operator: its
// turns fail. One whose last error is older is no longer tried, and is
// only listed.
func (r *Report) gatherAgents(ctx context.Context, db schema.Executor, o Options) error {
	agents, err := schema.ListAgentEndpoints(ctx, db)
	if err != nil {
		return err
	}
	r.Agents = agents
	now := time.Now()
	for _, a := range agents {
		if a.Reachable || a.LastErrorAt == nil || now.Sub(a.Since) < o.StallAfter || now.Sub(*a.LastErrorAt) >= o.StallAfter {
			continue
		}
		r.attention("agent %s has not answered a step request for %s (--stall-after %s); the last error, %s ago: %s: check that it runs and speaks %s at the workers' BATON_AGENT_URL (--agent-url), and their logs (component=agent)",
			a.Name, round(now.Sub(a.Since)), o.StallAfter, round(now.Sub(*a.LastErrorAt)), a.LastError, a.Protocol)
	}
	return nil
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
	if s.LagBytes > o.MaxLagBytes {
		r.attention("replication slot %q lags %s behind the WAL (threshold %s)", o.Slot, Bytes(s.LagBytes), Bytes(o.MaxLagBytes))
	}
	if s.WALStatus == "lost" || s.WALStatus == "unreserved" {
		r.attention("replication slot %q has wal_status %s: WAL it needs is gone or about to be; the relay recreates it and re-announces pending rows", o.Slot, s.WALStatus)
	}
	p, err := schema.ReadSlotProgress(ctx, db, o.Slot)
	if errors.Is(err, schema.ErrNotFound) {
		return nil // dropped since
	}
	if err != nil {
		return err
	}
	var unobserved time.Duration
	if p.Recorded {
		progressed, observed := p.ProgressedAt, p.ObservedAt
		s.ProgressedAt, s.ObservedAt = &progressed, &observed
		unobserved = p.SinceObserved
	}
	s.StalledFor = Duration(p.Stalled)
	// A slot is inactive for a moment while its relay restarts or a
	// standby relay takes over; relays record the slot at each heartbeat
	// wherever they are, so a recent record means one is about to read it.
	switch {
	case s.Active:
	case !p.Recorded:
		r.attention("replication slot %q is inactive: no relay is reading it (lag %s, retained WAL %s); start `baton relay`", o.Slot, Bytes(s.LagBytes), Bytes(s.RetainedWALBytes))
	case unobserved >= o.StallAfter:
		r.attention("replication slot %q is inactive and no relay has looked at it for %s (lag %s, retained WAL %s); start `baton relay`", o.Slot, round(unobserved), Bytes(s.LagBytes), Bytes(s.RetainedWALBytes))
	}
	if p.Stalled >= o.StallAfter {
		r.attention("replication slot %q has not confirmed a new position for %s while %s of WAL waits behind it (--stall-after %s): the relay is stopped or stuck; check that `baton relay` runs and reaches NATS (it confirms only what JetStream acknowledged), and restart it", o.Slot, round(p.Stalled), Bytes(p.LagBytes), o.StallAfter)
	}
	return nil
}

// gatherDatabase reads which server answered, its timeline and its
// standbys.
func (r *Report) gatherDatabase(ctx context.Context, db schema.Executor) error {
	d := &Database{Standbys: []Standby{}}
	var inRecovery bool
	err := db.QueryRow(ctx, `
		SELECT current_database(), coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local socket'),
		       pg_is_in_recovery(), current_setting('synchronous_standby_names')`).Scan(
		&d.Name, &d.Server, &inRecovery, &d.SynchronousStandbyNames)
	if err != nil {
		return fmt.Errorf("read the database server: %w", err)
	}
	if inRecovery {
		return fmt.Errorf("%w at %s: the slot and the outbox are read on the primary; give its URL, or list every server in one URL with target_session_attrs=read-write (postgres://host1,host2/baton?target_session_attrs=read-write)", ErrStandby, d.Server)
	}
	if err := db.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`).Scan(&d.Timeline); err != nil {
		return fmt.Errorf("read the timeline: %w", err)
	}
	// Physical WAL senders serve no database; logical ones (the relay) do.
	// A role without pg_read_all_stats sees them with no details.
	rows, err := db.Query(ctx, `
		SELECT coalesce(r.application_name, ''), coalesce(host(r.client_addr), ''), r.state, r.sync_state,
		       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn), 0)::bigint
		FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
		WHERE a.datid IS NULL ORDER BY r.application_name`)
	if err != nil {
		return fmt.Errorf("list standbys: %w", err)
	}
	defer rows.Close()
	synchronous, hidden := 0, 0
	for rows.Next() {
		var sb Standby
		var state, syncState *string
		if err := rows.Scan(&sb.Name, &sb.Client, &state, &syncState, &sb.ReplayLagBytes); err != nil {
			return err
		}
		if state == nil || syncState == nil {
			hidden++
			sb.State, sb.SyncState = "unknown", "unknown"
		} else {
			sb.State, sb.SyncState = *state, *syncState
		}
		if sb.SyncState == "sync" || sb.SyncState == "quorum" {
			synchronous++
		}
		d.Standbys = append(d.Standbys, sb)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list standbys: %w", err)
	}
	r.Database = d
	if hidden > 0 {
		r.Errors["standbys"] = "the standbys' state is hidden from this role: grant it pg_read_all_stats (or pg_monitor) to see it"
	}
	if d.SynchronousStandbyNames != "" && synchronous == 0 && hidden == 0 {
		r.attention("synchronous_standby_names is %q but no synchronous standby is connected: every commit waits, so no message is stored and no turn ends; bring the standby back, or clear synchronous_standby_names", d.SynchronousStandbyNames)
	}
	return nil
}

func (r *Report) gatherOutbox(ctx context.Context, db schema.Executor, o Options) error {
	r.Outbox.ByStatus = map[string]int64{"pending": 0, "processing": 0, "done": 0, "error": 0}
	q := `SELECT status, count(*) FROM agent_outbox GROUP BY status`
	if o.NoScans {
		r.Outbox.ByStatus = map[string]int64{"pending": 0}
		q = `SELECT 'pending', count(*) FROM agent_outbox WHERE status = 'pending'`
	}
	rows, err := db.Query(ctx, q)
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
		SELECT count(*), count(*) FILTER (WHERE lease_expires_at < now()),
		       count(*) FILTER (WHERE lease_expires_at < now() - make_interval(secs => $1))
		FROM conversations WHERE run_id IS NOT NULL`, o.LeaseGrace.Seconds()).Scan(&r.Leases.Held, &r.Leases.Expired, &r.Leases.Overdue); err != nil {
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
	if err := lrows.Err(); err != nil {
		return err
	}
	if r.Leases.Overdue > 0 {
		r.attention("%d run(s) hold leases that expired over %s ago (--lease-grace): their worker stopped mid-turn and no worker recovered them; start `baton worker` (it recovers expired leases at start and every half lease), or check that the workers reach PostgreSQL", r.Leases.Overdue, o.LeaseGrace)
	}
	return nil
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
	var infos []*jetstream.ConsumerInfo
	for ci := range lister.Info() {
		infos = append(infos, ci)
	}
	if err := lister.Err(); err != nil {
		r.Errors["groups"] = err.Error()
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	for _, ci := range infos {
		g := Group{
			Name: ci.Name, Pending: ci.NumPending, AckPending: ci.NumAckPending,
			Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting, LastActivity: ci.Delivered.Last,
			LastAck: ci.AckFloor.Last,
		}
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			r.gatherStall(ctx, st, ci, &g, o)
		}
		r.Groups = append(r.Groups, g)
	}
}

// gatherStall finds how long events have waited for a consumer without an
// acknowledgement. Both ends are the server's clock: the consumer info's
// time, the oldest waiting event's store time and the last ack's time.
// A server that restarted has forgotten its last ack, and then the oldest
// waiting event's age alone counts.
func (r *Report) gatherStall(ctx context.Context, st jetstream.Stream, ci *jetstream.ConsumerInfo, g *Group, o Options) {
	oldest, err := oldestWaiting(ctx, st, ci)
	if err != nil {
		r.Errors["group "+ci.Name] = err.Error()
		return
	}
	if oldest == nil {
		return
	}
	g.OldestWaiting = oldest
	now := ci.TimeStamp
	if now.IsZero() {
		now = time.Now()
	}
	stalled := now.Sub(*oldest)
	if ci.AckFloor.Last != nil {
		stalled = min(stalled, now.Sub(*ci.AckFloor.Last))
	}
	stalled = max(stalled, 0)
	g.StalledFor = Duration(stalled)
	if stalled < o.StallAfter {
		return
	}
	reader := "the process that reads it (for a Baton group, `baton group run " + ci.Name + "`)"
	if ci.Name == batonnats.DefaultConsumer {
		reader = "`baton worker`"
	}
	idle := ""
	if ci.NumWaiting == 0 {
		idle = ", and nobody is pulling"
	}
	r.attention("consumer %s of stream %s: %d event(s) waiting, the oldest %s old, and no acknowledgement for %s (--stall-after %s)%s: start or fix %s, or delete the consumer if nothing uses it any more", ci.Name, o.Stream, ci.NumPending+uint64(ci.NumAckPending), round(now.Sub(*oldest)), round(stalled), o.StallAfter, idle, reader)
}

// oldestWaiting returns when the stream stored the first event after the
// consumer's ack floor that the consumer's filters match, or nil when
// there is none (the ack floor is the stream's end).
func oldestWaiting(ctx context.Context, st jetstream.Stream, ci *jetstream.ConsumerInfo) (*time.Time, error) {
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append(filters, ci.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var oldest *time.Time
	for _, f := range filters {
		m, err := st.GetMsg(ctx, ci.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the oldest event waiting for consumer %s: %w", ci.Name, err)
		}
		if oldest == nil || m.Time.Before(*oldest) {
			t := m.Time
			oldest = &t
		}
	}
	return oldest, nil
}

// round makes a duration short to read.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
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

// gatherTables reads the tables' sizes. It is information, not a check: a
// role that may not read them gets the report without them and a hint.
func (r *Report) gatherTables(ctx context.Context, db schema.Executor) {
	stats, err := schema.TableStats(ctx, db)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		r.Errors["tables"] = "the table sizes are hidden from this role: run the migrations, which grant the status role what it needs (00011)"
	case err != nil:
		r.Errors["tables"] = err.Error()
	default:
		r.Tables = stats
	}
}

// SignIn is what the API accepts as a user's token, as the settings given
// to status say (the same BATON_JWT_* variables as the API's). It never
// holds a secret.
type SignIn struct {
	// BatonTokens is always true: tokens of `baton token create` work
	// beside any JWT.
	BatonTokens bool `json:"baton_tokens"`
	// JWT is nil when no JWT is accepted.
	JWT *JWTSignIn `json:"jwt,omitempty"`
}

// JWTSignIn is whose JWTs are accepted and where the keys come from.
type JWTSignIn struct {
	// Issuer is the OpenID Connect issuer; empty when only HS256 tokens
	// are accepted.
	Issuer   string `json:"issuer,omitempty"`
	Audience string `json:"audience"`
	// UserClaim names the user after the issuer.
	UserClaim string `json:"user_claim"`
	// KeySource is the JWKS URL given, or "discovery: <URL>".
	KeySource string `json:"key_source,omitempty"`
	// JWKSURL is where the keys were fetched from.
	JWKSURL string `json:"jwks_url,omitempty"`
	// Keys is how many signing keys were fetched.
	Keys int `json:"keys"`
	// Error is why the keys cannot be fetched; empty when they could.
	Error string `json:"error,omitempty"`
	// HS256Issuer is the iss of a backend's HS256 tokens; empty when
	// HS256 is refused.
	HS256Issuer string `json:"hs256_issuer,omitempty"`
}

// SetSignIn adds what the API accepts to the report; keys that cannot be
// fetched need attention, since every token of the issuer is refused
// until they can.
func (r *Report) SetSignIn(s SignIn) {
	r.SignIn = &s
	if s.JWT != nil && s.JWT.Error != "" {
		r.Attention = append(r.Attention, fmt.Sprintf("JWT sign-in: the keys of issuer %s cannot be fetched (%s): its tokens are refused until they can", s.JWT.Issuer, s.JWT.Error))
	}
}
