package schema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/setting"
)

// Retention: what Prune deletes, once no invariant needs it.
//
//   - agent_outbox: done and error rows finished longer than Outbox ago.
//     Pending and processing rows are never pruned. The error rows of a
//     conversation whose last message is a visible failure are kept, so it
//     still shows as failed and its Retry still works however long its user
//     takes. The messages stay: a pruned row's user message merely loses
//     its outbox status.
//   - operations: the operations of runs that produced no reply (attached
//     to no message: failed attempts that were retried, recovered,
//     superseded or abandoned runs) once the run ended longer than
//     Operations ago. An operation attached to a reply or to a visible error
//     is part of how that message came about and stays with it.
//   - agent_runs: runs that ended (any status but running) longer than Runs
//     ago and have no operation left. A run never goes while it holds a
//     lease. A run whose operations are attached to a message stays while
//     they do: its foreign key would delete them with it.
//   - group_inbox: rows of events that the stream no longer holds, so that
//     no redelivery or replay can bring the event back (see StreamFloor).
//   - operator_actions: the console's record of what operators did and
//     viewed, once older than OperatorActions.
//
// And files (migration 00029) that no message references any more: the
// delete of a conversation removes those only its messages referenced, in
// its transaction; a pass sweeps any left (PruneResult.Files).
//
// Messages, conversations, dead letters and audit events are never pruned.

// Defaults of a Retention.
const (
	DefaultOutboxRetention         = 30 * 24 * time.Hour
	DefaultRunRetention            = 30 * 24 * time.Hour
	DefaultOperationRetention      = 30 * 24 * time.Hour
	DefaultInboxMargin             = 24 * time.Hour
	DefaultOperatorActionRetention = 90 * 24 * time.Hour
	DefaultPruneBatch              = 1000
	DefaultPrunePassTime           = time.Minute
	DefaultPruneStatementTimeout   = 30 * time.Second
	minimumPruneStatementTimeout   = 100 * time.Millisecond
	minimumPruneLockTimeout        = 50 * time.Millisecond
)

// Prunable tables, as PruneResult and the metrics name them.
const (
	TableOutbox          = "agent_outbox"
	TableRuns            = "agent_runs"
	TableOperations      = "operations"
	TableInbox           = "group_inbox"
	TableOperatorActions = "operator_actions"
)

// PrunedTables are the tables Prune deletes from, in the order of a round:
// operations before runs, so that a run whose operations go can go in the
// same pass.
var PrunedTables = []string{TableOperations, TableRuns, TableOutbox, TableInbox, TableOperatorActions}

// Retention configures Prune.
type Retention struct {
	// Outbox is how long done and error outbox rows are kept after they
	// were finished. Defaults to 30 days.
	Outbox time.Duration
	// Runs is how long a run is kept after it ended. Defaults to 30 days.
	Runs time.Duration
	// Operations is how long the operations of a run that produced no
	// reply are kept after the run ended. Defaults to 30 days.
	Operations time.Duration
	// InboxMargin is how much older than the oldest event the stream holds
	// an inbox row must be before it goes: it covers the clocks of
	// PostgreSQL and NATS disagreeing, and a relay that publishes an event
	// again (same id, a second copy) after being away for less than it.
	// Defaults to 24 hours.
	InboxMargin time.Duration
	// OperatorActions is how long the console's record of operators'
	// actions and views is kept. Defaults to 90 days.
	OperatorActions time.Duration
	// Batch is how many rows one statement deletes at most. Defaults to
	// 1000.
	Batch int
	// PassTime bounds one pass: a pass that has not caught up by then
	// stops, and the next one goes on. Defaults to 1 minute.
	PassTime time.Duration
	// StatementTimeout bounds one statement, and a tenth of it how long a
	// statement waits for a lock: a batch never holds locks for long, and
	// never queues behind a long one. Defaults to 30 seconds.
	StatementTimeout time.Duration
}

// WithDefaults returns a copy with every zero field set to its default.
func (r Retention) WithDefaults() Retention {
	if r.Outbox == 0 {
		r.Outbox = DefaultOutboxRetention
	}
	if r.Runs == 0 {
		r.Runs = DefaultRunRetention
	}
	if r.Operations == 0 {
		r.Operations = DefaultOperationRetention
	}
	if r.InboxMargin == 0 {
		r.InboxMargin = DefaultInboxMargin
	}
	if r.OperatorActions == 0 {
		r.OperatorActions = DefaultOperatorActionRetention
	}
	if r.Batch == 0 {
		r.Batch = DefaultPruneBatch
	}
	if r.PassTime == 0 {
		r.PassTime = DefaultPrunePassTime
	}
	if r.StatementTimeout == 0 {
		r.StatementTimeout = DefaultPruneStatementTimeout
	}
	return r
}

// Validate returns a *setting.Error for the first setting that is wrong.
func (r Retention) Validate() error {
	switch {
	case r.Outbox <= 0:
		return setting.Errorf("Outbox", r.Outbox, "must be positive, such as %s", DefaultOutboxRetention)
	case r.Runs <= 0:
		return setting.Errorf("Runs", r.Runs, "must be positive, such as %s", DefaultRunRetention)
	case r.Operations <= 0:
		return setting.Errorf("Operations", r.Operations, "must be positive, such as %s", DefaultOperationRetention)
	case r.OperatorActions <= 0:
		return setting.Errorf("OperatorActions", r.OperatorActions, "must be positive, such as %s", DefaultOperatorActionRetention)
	case r.InboxMargin < 0:
		return setting.Errorf("InboxMargin", r.InboxMargin, "must not be negative, such as %s", DefaultInboxMargin)
	case r.Batch < 1 || r.Batch > 100000:
		return setting.Errorf("Batch", r.Batch, "must be between 1 and 100000, such as %d", DefaultPruneBatch)
	case r.PassTime <= 0:
		return setting.Errorf("PassTime", r.PassTime, "must be positive, such as %s", DefaultPrunePassTime)
	case r.StatementTimeout < minimumPruneStatementTimeout:
		return setting.Errorf("StatementTimeout", r.StatementTimeout, "must be at least %s", minimumPruneStatementTimeout)
	}
	return nil
}

// StreamFloor is where a stream starts, as JetStream reports it: what a
// redelivery or a replay can still bring back. Inbox rows record the
// stream and the sequence of the event they applied, and an inbox row goes
// only when both of these hold:
//
//   - by time: it was applied more than Retention.InboxMargin before the
//     oldest event the stream holds was stored. The copy the group applied
//     was stored before it was applied, so that copy is gone. This holds
//     also for a stream deleted and created again, whose sequences
//     restart at 1.
//   - by sequence: its stream sequence is below the stream's first one, or
//     it was applied before the stream was created (then its sequence is
//     one of an earlier stream of the same name, and says nothing about
//     this one).
//
// An event published twice under one id (a relay that resumed from its
// slot after the stream's duplicate window) is two copies, and the second
// one may be newer than the inbox row: only the margin covers it.
type StreamFloor struct {
	// Stream is the stream's name.
	Stream string
	// FirstSeq is the first sequence the stream holds; when it is empty,
	// the next sequence it will use.
	FirstSeq uint64
	// FirstTime is when the stream stored its first message; when it is
	// empty, when it was read.
	FirstTime time.Time
	// Created is when the stream was created.
	Created time.Time
	// Outbox marks the relay's outbox stream: inbox rows recorded before
	// rows named their stream count as its rows.
	Outbox bool
}

// PruneResult says what Prune deleted, or for a dry run what it would.
type PruneResult struct {
	// Rows by table (PrunedTables).
	Rows map[string]int64
	// CaughtUp is false when the pass stopped at Retention.PassTime with
	// rows left to prune.
	CaughtUp bool
	// Streams are the streams whose inbox rows were looked at.
	Streams []string
	// Files are the files removed that no message referenced.
	Files int64
}

// PruneCursor is where a pruner stands in the ended runs it keeps (those
// whose operations are attached to a message), so that a pass reads them
// once rather than at every batch. The zero value starts at the oldest.
type PruneCursor struct {
	runAt time.Time
	runID string
}

// Prune runs one pass of retention over db: rounds of one batch per table
// (PrunedTables), each batch its own short transaction, until every table
// is caught up or Retention.PassTime is spent. cursor may be nil; a pruner
// that runs pass after pass gives the same one each time. floors are the
// streams whose inbox rows may be pruned; inbox rows of any other stream
// are kept. On an error the result counts what was deleted before it.
func Prune(ctx context.Context, db Beginner, r Retention, floors []StreamFloor, cursor *PruneCursor) (PruneResult, error) {
	r = r.WithDefaults()
	if err := r.Validate(); err != nil {
		return PruneResult{}, err
	}
	if cursor == nil {
		cursor = &PruneCursor{}
	}
	res := PruneResult{Rows: map[string]int64{}, Streams: streamNames(floors)}
	for _, t := range PrunedTables {
		res.Rows[t] = 0
	}
	deadline := time.Now().Add(r.PassTime)
	done := map[string]bool{}
	inboxDone := make([]bool, len(floors))
	for {
		more := false
		for _, table := range PrunedTables {
			if done[table] {
				continue
			}
			if time.Now().After(deadline) {
				return res, nil
			}
			var n int64
			var left bool
			var err error
			switch table {
			case TableOperations:
				n, left, err = pruneBatch(ctx, db, r, pruneOperationsSQL, r.Operations.Seconds(), r.Batch)
			case TableRuns:
				n, left, err = pruneRuns(ctx, db, r, cursor)
			case TableOutbox:
				n, left, err = pruneBatch(ctx, db, r, pruneOutboxSQL, r.Outbox.Seconds(), r.Batch)
			case TableOperatorActions:
				n, left, err = pruneBatch(ctx, db, r, pruneOperatorActionsSQL, r.OperatorActions.Seconds(), r.Batch)
			case TableInbox:
				for i, f := range floors {
					if inboxDone[i] {
						continue
					}
					k, l, ferr := pruneInbox(ctx, db, r, f, floors)
					n += k
					if ferr != nil {
						err = ferr
						break
					}
					inboxDone[i] = !l
					left = left || l
				}
			}
			res.Rows[table] += n
			if err != nil {
				return res, fmt.Errorf("prune %s: %w", table, err)
			}
			done[table] = !left
			more = more || left
		}
		if !more {
			n, err := PruneFiles(ctx, db, r.Batch)
			res.Files = int64(n)
			if err != nil {
				return res, err
			}
			res.CaughtUp = true
			return res, nil
		}
	}
}

// PruneDryRun counts what a pass of Prune with the same settings would
// delete if it had all the time it needs, and deletes nothing. A run
// counts when the operations it still has would be pruned before it.
func PruneDryRun(ctx context.Context, db Executor, r Retention, floors []StreamFloor) (PruneResult, error) {
	r = r.WithDefaults()
	if err := r.Validate(); err != nil {
		return PruneResult{}, err
	}
	res := PruneResult{Rows: map[string]int64{}, CaughtUp: true, Streams: streamNames(floors)}
	count := func(table, q string, args ...any) error {
		var n int64
		if err := db.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			return fmt.Errorf("count the prunable rows of %s: %w", table, err)
		}
		res.Rows[table] += n
		return nil
	}
	if err := count(TableOperations, `SELECT count(*) FROM operations c WHERE `+operationPrunable("c", "$1"), r.Operations.Seconds()); err != nil {
		return res, err
	}
	if err := count(TableRuns, `
		SELECT count(*) FROM agent_runs c WHERE `+runEnded+` AND `+runLeaseFree+`
			AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.run_id = c.id AND NOT (`+operationPrunable("o", "$2")+`))`,
		r.Runs.Seconds(), r.Operations.Seconds()); err != nil {
		return res, err
	}
	if err := count(TableOutbox, `SELECT count(*) FROM agent_outbox c WHERE `+outboxPrunable, r.Outbox.Seconds()); err != nil {
		return res, err
	}
	if err := count(TableOperatorActions, `SELECT count(*) FROM operator_actions c WHERE `+operatorActionPrunable, r.OperatorActions.Seconds()); err != nil {
		return res, err
	}
	res.Rows[TableInbox] = 0
	for _, f := range floors {
		if err := count(TableInbox, `SELECT count(*) FROM group_inbox c WHERE `+inboxPrunable, inboxArgs(r, f, floors)...); err != nil {
			return res, err
		}
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM files f
		WHERE NOT EXISTS (SELECT FROM message_files mf WHERE mf.owner_id = f.owner_id AND mf.sha256 = f.sha256)`).Scan(&res.Files); err != nil {
		return res, fmt.Errorf("count the files no message references: %w", err)
	}
	return res, nil
}

// The rules, over a row aliased c; $1 is the retention in seconds.
const (
	// Done rows, and error rows unless the conversation's last message is
	// a visible failure (messages_conversation finds it).
	outboxPrunable = `c.status IN ('done', 'error')
		AND coalesce(c.processed_at, c.created_at) < now() - make_interval(secs => $1)
		AND (c.status = 'done' OR coalesce((SELECT m.role FROM messages m WHERE m.conversation_id = c.conversation_id
			ORDER BY m.seq DESC LIMIT 1), '') <> 'error')`

	// An operator's action older than the retention.
	operatorActionPrunable = `c.at < now() - make_interval(secs => $1)`

	// A run that ended before the retention.
	runEnded = `c.status <> 'running' AND coalesce(c.finished_at, c.started_at) < now() - make_interval(secs => $1)`

	// A run that holds no lease. Every path that ends a run releases its
	// lease in the same transaction, so this excludes nothing today; it is
	// the invariant, checked where it is cheap (by the primary key).
	runLeaseFree = `NOT EXISTS (SELECT 1 FROM conversations v WHERE v.id = c.conversation_id AND v.run_id = c.id)`

	// $1 the time before which a row was applied (the stream's first time
	// less the margin), $2 the stream, $3 the outbox stream (rows without
	// a stream are its rows) or NULL, $4 the stream's first sequence, $5
	// when it was created. See StreamFloor.
	inboxPrunable = `c.processed_at < $1
		AND coalesce(c.stream, $3) = $2
		AND (c.stream_seq < $4 OR c.processed_at < $5)`
)

// operationPrunable is the rule of operations over a row aliased alias,
// with the retention in seconds in the parameter param: an operation
// attached to no message, of a run that ended before the retention and
// holds no lease. Such a run's operations no longer change: finalize and a
// visible failure attach them only while the run runs.
//
// An operation of a turn whose rows wait to go on from its journal of
// steps is never pruned: its outcome is what keeps the turn from sending
// its call again.
func operationPrunable(alias, param string) string {
	return fmt.Sprintf(`%[1]s.message_id IS NULL AND EXISTS (
		SELECT 1 FROM agent_runs r WHERE r.id = %[1]s.run_id AND r.status <> 'running'
			AND coalesce(r.finished_at, r.started_at) < now() - make_interval(secs => %[2]s)
			AND NOT EXISTS (SELECT 1 FROM conversations v WHERE v.id = r.conversation_id AND v.run_id = r.id))
		AND (%[1]s.turn_id IS NULL OR NOT EXISTS (
			SELECT 1 FROM agent_outbox x WHERE x.conversation_id = %[1]s.conversation_id AND x.steps_turn_id = %[1]s.turn_id
				AND x.status IN ('pending', 'processing')))`, alias, param)
}

var (
	// Outbox rows are the only ones another transaction may hold (a user's
	// retry puts error rows back to pending): those are skipped, and a row
	// changed meanwhile is checked again by FOR UPDATE before it goes.
	pruneOutboxSQL = `
		WITH w AS (
			SELECT c.id FROM agent_outbox c WHERE ` + outboxPrunable + `
			ORDER BY coalesce(c.processed_at, c.created_at), c.id
			LIMIT $2
			FOR UPDATE SKIP LOCKED)
		DELETE FROM agent_outbox o USING w WHERE o.id = w.id`

	// Operator actions are written once and never changed.
	pruneOperatorActionsSQL = `
		WITH w AS (
			SELECT c.id FROM operator_actions c WHERE ` + operatorActionPrunable + `
			ORDER BY c.at
			LIMIT $2)
		DELETE FROM operator_actions o USING w WHERE o.id = w.id`

	// The operations of ended runs no longer change, so nobody holds them.
	pruneOperationsSQL = `
		WITH w AS (
			SELECT c.id FROM operations c WHERE ` + operationPrunable("c", "$1") + `
			ORDER BY c.id
			LIMIT $2)
		DELETE FROM operations o USING w WHERE o.id = w.id`
)

// pruneBatch runs one delete of up to a batch of rows in a short
// transaction and says whether more may be left.
func pruneBatch(ctx context.Context, db Beginner, r Retention, q string, args ...any) (int64, bool, error) {
	var n int64
	err := shortTx(ctx, db, r, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, q, args...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return n, n >= int64(r.Batch), nil
}

// pruneRuns deletes, in the next window of ended runs after the cursor,
// those that have no operation and hold no lease. Ended runs are never
// changed again, so nobody holds them. The window moves on past the runs
// it keeps (those whose operations are attached to a message), so each is
// read once a sweep rather than at every batch.
func pruneRuns(ctx context.Context, db Beginner, r Retention, cursor *PruneCursor) (int64, bool, error) {
	var n, window int64
	var lastAt *time.Time
	var lastID *string
	at := cursor.runAt
	if at.IsZero() {
		at = time.Unix(0, 0)
	}
	err := shortTx(ctx, db, r, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `
			WITH w AS (
				SELECT c.id, coalesce(c.finished_at, c.started_at) AS at FROM agent_runs c
				WHERE `+runEnded+`
					AND (coalesce(c.finished_at, c.started_at), c.id) > ($3::timestamptz, $4::text)
				ORDER BY coalesce(c.finished_at, c.started_at), c.id
				LIMIT $2),
			d AS (
				DELETE FROM agent_runs c USING w
				WHERE c.id = w.id AND c.status <> 'running' AND `+runLeaseFree+`
					AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.run_id = c.id)
				RETURNING c.id),
			last AS (SELECT at, id FROM w ORDER BY at DESC, id DESC LIMIT 1)
			SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM w), (SELECT at FROM last), (SELECT id FROM last)`,
			r.Runs.Seconds(), r.Batch, at, cursor.runID).Scan(&n, &window, &lastAt, &lastID)
	})
	if err != nil {
		return 0, false, err
	}
	if window < int64(r.Batch) || lastAt == nil || lastID == nil {
		// The end of the runs to look at: the next sweep starts over.
		*cursor = PruneCursor{}
		return n, false, nil
	}
	cursor.runAt, cursor.runID = *lastAt, *lastID
	return n, true, nil
}

// pruneInbox deletes up to a batch of the inbox rows of f that the stream
// can no longer deliver again. Inbox rows are written once and never
// changed, so nobody holds them.
func pruneInbox(ctx context.Context, db Beginner, r Retention, f StreamFloor, floors []StreamFloor) (int64, bool, error) {
	args := append(inboxArgs(r, f, floors), r.Batch)
	return pruneBatch(ctx, db, r, `
		WITH w AS (
			SELECT c.group_name, c.event_id FROM group_inbox c WHERE `+inboxPrunable+`
			ORDER BY c.processed_at
			LIMIT $6)
		DELETE FROM group_inbox g USING w WHERE g.group_name = w.group_name AND g.event_id = w.event_id`, args...)
}

func inboxArgs(r Retention, f StreamFloor, floors []StreamFloor) []any {
	var outbox *string
	for _, o := range floors {
		if o.Outbox {
			name := o.Stream
			outbox = &name
		}
	}
	return []any{f.FirstTime.Add(-r.InboxMargin), f.Stream, outbox, int64(f.FirstSeq), f.Created}
}

func streamNames(floors []StreamFloor) []string {
	out := make([]string, 0, len(floors))
	for _, f := range floors {
		out = append(out, f.Stream)
	}
	return out
}

// shortTx runs fn in a transaction that never waits long for a lock and
// never runs long.
func shortTx(ctx context.Context, db Beginner, r Retention, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, r.StatementTimeout.Milliseconds())); err != nil {
			return err
		}
		lock := max(r.StatementTimeout/10, minimumPruneLockTimeout)
		if err := setLockTimeout(ctx, tx, lock); err != nil {
			return err
		}
		return fn(tx)
	})
}

// TableStat is the size of one of the tables that grow with use, and its
// oldest row: a pruner that keeps up holds Oldest near the table's
// retention.
type TableStat struct {
	Table string `json:"table"`
	// Bytes is the table's size on disk, its indexes and TOAST included.
	Bytes int64 `json:"bytes"`
	// Rows is PostgreSQL's estimate of its live rows.
	Rows int64 `json:"rows"`
	// Oldest is the time of its oldest row, by the time its retention
	// counts from (Of says which); nil when it has no such row, and for
	// messages, which are never pruned and have no index to find it with.
	Oldest *time.Time `json:"oldest,omitempty"`
	// Of says which rows and which of their times Oldest is.
	Of string `json:"of,omitempty"`
}

// tableOldest finds the oldest row of each table through an index.
var tableOldest = []struct{ table, of, query string }{
	{TableOutbox, "done or error row, finished", `
		SELECT coalesce(processed_at, created_at) FROM agent_outbox WHERE status IN ('done', 'error')
		ORDER BY coalesce(processed_at, created_at) LIMIT 1`},
	{TableRuns, "ended run, ended", `
		SELECT coalesce(finished_at, started_at) FROM agent_runs WHERE status <> 'running'
		ORDER BY coalesce(finished_at, started_at) LIMIT 1`},
	{TableOperations, "operation attached to no message, started", `
		SELECT started_at FROM operations WHERE message_id IS NULL ORDER BY id LIMIT 1`},
	{TableInbox, "inbox row, applied", `SELECT processed_at FROM group_inbox ORDER BY processed_at LIMIT 1`},
	{"group_dead_letters", "unresolved dead letter, parked", `
		SELECT min(parked_at) FROM group_dead_letters WHERE resolved_at IS NULL`},
	{"audit_events", "audit event, recorded", `SELECT recorded_at FROM audit_events ORDER BY id LIMIT 1`},
	{TableOperatorActions, "operator action, recorded", `SELECT at FROM operator_actions ORDER BY at LIMIT 1`},
	{"messages", "", ``},
}

// TableStats returns the size, estimated rows and oldest row of the tables
// that grow with use: the four Prune keeps in check, and messages, dead
// letters and audit events, which it never prunes. It reads statistics and
// one row per table through an index, so it is cheap on tables of any
// size. `baton status` shows it; the status role may read what it needs
// (migration 00011).
func TableStats(ctx context.Context, db Executor) ([]TableStat, error) {
	names := make([]string, 0, len(tableOldest))
	for _, t := range tableOldest {
		names = append(names, t.table)
	}
	rows, err := db.Query(ctx, `
		SELECT c.relname, pg_total_relation_size(c.oid), coalesce(s.n_live_tup, 0)
		FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE c.relname = ANY($1) AND c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace`, names)
	if err != nil {
		return nil, fmt.Errorf("read table sizes: %w", err)
	}
	sizes := map[string]TableStat{}
	for rows.Next() {
		var s TableStat
		if err := rows.Scan(&s.Table, &s.Bytes, &s.Rows); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read table sizes: %w", err)
		}
		sizes[s.Table] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read table sizes: %w", err)
	}
	out := make([]TableStat, 0, len(tableOldest))
	for _, t := range tableOldest {
		s, ok := sizes[t.table]
		if !ok {
			continue
		}
		if t.query != "" {
			var oldest *time.Time
			if err := db.QueryRow(ctx, t.query).Scan(&oldest); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("read the oldest row of %s: %w", t.table, err)
			}
			s.Oldest, s.Of = oldest, t.of
		}
		out = append(out, s)
	}
	return out, nil
}
