package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// The operator console's reads. Each finds its rows through an index and
// reads a page of them (keyset pagination, never an offset), so every page
// costs the same at a million conversations as at ten; nothing counts a
// whole table.

// TurnStats is what the overview says of the turns: those running now and
// waiting for a person, and the last hour minute by minute, from
// agent_runs.
type TurnStats struct {
	Running            int64
	WaitingForApproval int64
	// FailedLastHour counts the turns that gave up visibly in the hour.
	FailedLastHour int64
	// Minutes are the hour's minutes, oldest first, every one present.
	Minutes []MinuteStat
	// WorkersAlive counts the workers whose database session lives (the
	// lock each holds while it runs).
	WorkersAlive int64
}

// MinuteStat is one minute of ended turns.
type MinuteStat struct {
	Start time.Time
	// Answered counts the runs that finalized a reply; Failed those that
	// gave up visibly.
	Answered, Failed int64
	// P50 and P99 are the latency of the answering runs, from claim to
	// reply; zero in a minute without one.
	P50, P99 time.Duration
}

// ReadTurnStats reads the overview's turns: the running runs (their
// partial index), the pending approvals (theirs), and the runs that ended
// in the last hour through the index of ended runs, which the hour bounds.
func ReadTurnStats(ctx context.Context, db Executor) (TurnStats, error) {
	var s TurnStats
	var now time.Time
	err := db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM agent_runs WHERE status = 'running'),
		       (SELECT count(*) FROM approvals WHERE status = 'pending'),
		       (SELECT count(*) FROM pg_locks l
		        WHERE l.locktype = 'advisory' AND l.classid = 1651797570 AND l.objsubid = 2 AND l.granted
		          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
		       date_trunc('minute', now())`).Scan(&s.Running, &s.WaitingForApproval, &s.WorkersAlive, &now)
	if err != nil {
		return s, fmt.Errorf("read turn counts: %w", err)
	}
	start := now.Add(-59 * time.Minute)
	rows, err := db.Query(ctx, `
		SELECT date_trunc('minute', coalesce(finished_at, started_at)) AS m,
		       count(*) FILTER (WHERE status = 'finalized'),
		       count(*) FILTER (WHERE status = 'failed' AND reply_message_id IS NOT NULL),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
		                FILTER (WHERE status = 'finalized'), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
		                FILTER (WHERE status = 'finalized'), 0)
		FROM agent_runs
		WHERE status <> 'running' AND coalesce(finished_at, started_at) >= $1
		GROUP BY m ORDER BY m`, start)
	if err != nil {
		return s, fmt.Errorf("read the hour's turns: %w", err)
	}
	byMinute := map[time.Time]MinuteStat{}
	for rows.Next() {
		var m MinuteStat
		var p50, p99 float64
		if err := rows.Scan(&m.Start, &m.Answered, &m.Failed, &p50, &p99); err != nil {
			rows.Close()
			return s, fmt.Errorf("read the hour's turns: %w", err)
		}
		m.P50, m.P99 = seconds(p50), seconds(p99)
		byMinute[m.Start.UTC()] = m
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("read the hour's turns: %w", err)
	}
	for i := range 60 {
		t := start.Add(time.Duration(i) * time.Minute).UTC()
		m, ok := byMinute[t]
		if !ok {
			m = MinuteStat{Start: t}
		}
		s.FailedLastHour += m.Failed
		s.Minutes = append(s.Minutes, m)
	}
	return s, nil
}

func seconds(f float64) time.Duration {
	return time.Duration(math.Round(f * float64(time.Second)))
}

// ConversationRow is a conversation as the console lists it.
type ConversationRow struct {
	// Key is the server's id of the conversation; PublicID the one its
	// client chose.
	Key, PublicID string
	OwnerID       int64
	Owner         string
	Title         string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	LastMessageAt *time.Time
	// RunID is the run that holds the conversation, and LeaseExpiresAt
	// until when; empty and nil when none does.
	RunID          string
	LeaseExpiresAt *time.Time
	// ApprovalID is the approval the conversation's turn waits for.
	ApprovalID *int64
}

const conversationRowColumns = `c.id, coalesce(c.public_id, c.id), c.owner_id, coalesce(u.name, ''), c.title, c.created_at, c.updated_at,
	c.last_message_at, coalesce(c.run_id, ''), c.lease_expires_at, c.approval_id`

func scanConversationRow(row pgx.CollectableRow) (ConversationRow, error) {
	var c ConversationRow
	err := row.Scan(&c.Key, &c.PublicID, &c.OwnerID, &c.Owner, &c.Title, &c.CreatedAt, &c.UpdatedAt,
		&c.LastMessageAt, &c.RunID, &c.LeaseExpiresAt, &c.ApprovalID)
	return c, err
}

// ConversationCursor is where a page of a user's conversations ends: the
// next page starts after it.
type ConversationCursor struct {
	UpdatedAt time.Time
	Key       string
}

// ConversationsByID finds the conversations whose server key or
// client-chosen id is id (a client's id may be any of its users').
func ConversationsByID(ctx context.Context, db Executor, id string, limit int) ([]ConversationRow, error) {
	rows, err := db.Query(ctx, `
		SELECT `+conversationRowColumns+`
		FROM conversations c LEFT JOIN users u ON u.id = c.owner_id
		WHERE c.id = $1 OR c.public_id = $1
		ORDER BY c.updated_at DESC, c.id DESC LIMIT $2`, id, limit)
	if err != nil {
		return nil, fmt.Errorf("find conversation %q: %w", id, err)
	}
	return pgx.CollectRows(rows, scanConversationRow)
}

// ConversationsOfUser lists a user's conversations, most recently updated
// first: up to limit after the cursor (nil: from the newest). A user
// unknown by that name has none.
func ConversationsOfUser(ctx context.Context, db Executor, user string, after *ConversationCursor, limit int) ([]ConversationRow, error) {
	at, key := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), ""
	if after != nil {
		at, key = after.UpdatedAt, after.Key
	}
	// updated_at <= $2 is the index's condition (conversations_owner):
	// the scan starts at the cursor, however deep the page.
	rows, err := db.Query(ctx, `
		SELECT `+conversationRowColumns+`
		FROM users u JOIN conversations c ON c.owner_id = u.id
		WHERE u.name = $1 AND c.updated_at <= $2 AND (c.updated_at < $2 OR $3 = '' OR c.id < $3)
		ORDER BY c.updated_at DESC, c.id DESC LIMIT $4`, user, at, key, limit)
	if err != nil {
		return nil, fmt.Errorf("list the conversations of %q: %w", user, err)
	}
	return pgx.CollectRows(rows, scanConversationRow)
}

// ConversationByKeyAny reads a conversation by its server key, whoever
// owns it: ErrNotFound when there is none.
func ConversationByKeyAny(ctx context.Context, db Executor, key string) (ConversationRow, error) {
	rows, err := db.Query(ctx, `
		SELECT `+conversationRowColumns+`
		FROM conversations c LEFT JOIN users u ON u.id = c.owner_id WHERE c.id = $1`, key)
	if err != nil {
		return ConversationRow{}, fmt.Errorf("read conversation %s: %w", key, err)
	}
	c, err := pgx.CollectExactlyOneRow(rows, scanConversationRow)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	return c, err
}

// MessageRow is one message as the console shows it.
type MessageRow struct {
	ID, PublicID string
	Role         string
	Content      string
	Reasoning    string
	// Detail is the operator's account of a visible error.
	Detail    string
	Seq       int64
	CreatedAt time.Time
	// RunID and TurnID say which run wrote a reply or an error.
	RunID, TurnID      string
	Truncated, Stopped bool
	Superseded         bool
	// The outbox row of a user message: its status and attempts, the
	// retry epoch and the journaled turn it belongs to.
	OutboxID          int64
	OutboxStatus      string
	OutboxAttempts    int
	OutboxEpoch       int
	OutboxStepsTurnID string
	OutboxGeneration  int
	OutboxRunID       string
	OutboxProcessedAt *time.Time
}

// RunRow is one attempt at a turn (agent_runs).
type RunRow struct {
	ID, TurnID      string
	OutboxIDs       []int64
	Worker          string
	Status          string
	Error           string
	ReplyMessageID  string
	StartedAt       time.Time
	FinishedAt      *time.Time
	LeaseExpiresAt  time.Time
	ConversationKey string
}

// OperationRow is one journaled call.
type OperationRow struct {
	ID                int64
	RunID             string
	TurnID            string
	Epoch, Step       *int
	ToolCallID, Tool  string
	Effect            Effect
	Status            string
	IdempotencyKey    string
	Arguments         string
	Result, Error     string
	MessageID         string
	OutcomeRecordedBy string
	StartedAt         time.Time
	FinishedAt        *time.Time
}

// OutcomeUnknown reports whether the call is a write that was sent and
// has no known outcome: it is never sent again, and an operator may say
// what became of it.
func (o OperationRow) OutcomeUnknown() bool {
	return o.Effect == EffectWrite && (o.Status == "started" || o.Status == "unknown")
}

// StepRow is one journaled step of a turn.
type StepRow struct {
	TurnID      string
	Epoch, Step int
	RunID       string
	Answer      json.RawMessage
	CreatedAt   time.Time
}

// ApprovalRow is one approval or question of a conversation.
type ApprovalRow struct {
	ID          int64
	PublicID    string
	Kind        string
	RunID       string
	TurnID      string
	OperationID *int64
	Tool        string
	Arguments   json.RawMessage
	Question    json.RawMessage
	Answer      json.RawMessage
	Status      string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	DecidedAt   *time.Time
}

// TurnRecord is one turn of a conversation: its attempts (runs), its
// journal of steps and calls, and its approvals.
type TurnRecord struct {
	TurnID     string
	Runs       []RunRow
	Steps      []StepRow
	Operations []OperationRow
	Approvals  []ApprovalRow
}

// ConversationRecord is what the console shows of one conversation.
type ConversationRecord struct {
	Conversation ConversationRow
	// Messages are the newest page of messages, oldest first.
	Messages []MessageRow
	// OlderThan is the seq to read older messages before; zero when the
	// page holds the first message.
	OlderThan int64
	// Turns are the turns of the conversation's newest runs, newest
	// first.
	Turns []TurnRecord
}

// ReadConversationRecord reads a conversation by its key: up to limit of
// its messages before the seq before (0: the newest), and the turns of its
// newest runs, with their journal and approvals. Every read goes through
// an index on the conversation.
func ReadConversationRecord(ctx context.Context, db Executor, key string, before int64, limit int) (ConversationRecord, error) {
	var rec ConversationRecord
	c, err := ConversationByKeyAny(ctx, db, key)
	if err != nil {
		return rec, err
	}
	rec.Conversation = c
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := db.Query(ctx, `
		SELECT m.id, coalesce(m.public_id, ''), m.role, m.content, coalesce(m.reasoning, ''), coalesce(m.detail, ''), m.seq, m.created_at,
		       coalesce(m.run_id, ''), coalesce(m.turn_id, ''), m.truncated, m.stopped, m.superseded_at IS NOT NULL,
		       coalesce(o.id, 0), coalesce(o.status, ''), coalesce(o.attempts, 0), coalesce(o.epoch, 0), coalesce(o.steps_turn_id, ''),
		       coalesce(o.generation, 0), coalesce(o.run_id, ''), o.processed_at
		FROM messages m LEFT JOIN agent_outbox o ON o.message_id = m.id
		WHERE m.conversation_id = $1 AND m.seq < $2
		ORDER BY m.seq DESC LIMIT $3`, key, before, limit+1)
	if err != nil {
		return rec, fmt.Errorf("read the messages of %s: %w", key, err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (MessageRow, error) {
		var m MessageRow
		err := row.Scan(&m.ID, &m.PublicID, &m.Role, &m.Content, &m.Reasoning, &m.Detail, &m.Seq, &m.CreatedAt,
			&m.RunID, &m.TurnID, &m.Truncated, &m.Stopped, &m.Superseded,
			&m.OutboxID, &m.OutboxStatus, &m.OutboxAttempts, &m.OutboxEpoch, &m.OutboxStepsTurnID,
			&m.OutboxGeneration, &m.OutboxRunID, &m.OutboxProcessedAt)
		return m, err
	})
	if err != nil {
		return rec, fmt.Errorf("read the messages of %s: %w", key, err)
	}
	if len(msgs) > limit {
		msgs = msgs[:limit]
		rec.OlderThan = msgs[len(msgs)-1].Seq
	}
	for i, j := 0, len(msgs)-1; i < j; i, j = i+1, j-1 {
		msgs[i], msgs[j] = msgs[j], msgs[i]
	}
	rec.Messages = msgs
	if rec.Turns, err = readTurns(ctx, db, key, limit); err != nil {
		return rec, err
	}
	return rec, nil
}

// readTurns reads the conversation's newest runs (up to limit), grouped
// by turn, with each turn's journal and approvals.
func readTurns(ctx context.Context, db Executor, key string, limit int) ([]TurnRecord, error) {
	rows, err := db.Query(ctx, `
		SELECT id, turn_id, outbox_ids, worker, status, coalesce(error, ''), coalesce(reply_message_id, ''),
		       started_at, finished_at, lease_expires_at, conversation_id
		FROM agent_runs WHERE conversation_id = $1
		ORDER BY started_at DESC LIMIT $2`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("read the runs of %s: %w", key, err)
	}
	runs, err := pgx.CollectRows(rows, scanRunRow)
	if err != nil {
		return nil, fmt.Errorf("read the runs of %s: %w", key, err)
	}
	var turns []TurnRecord
	index := map[string]int{}
	var runIDs, turnIDs []string
	// Runs come newest first; a turn's runs are listed oldest first.
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		runIDs = append(runIDs, r.ID)
		k, ok := index[r.TurnID]
		if !ok {
			k = len(turns)
			index[r.TurnID] = k
			turns = append(turns, TurnRecord{TurnID: r.TurnID})
			turnIDs = append(turnIDs, r.TurnID)
		}
		turns[k].Runs = append(turns[k].Runs, r)
	}
	if len(turns) == 0 {
		return nil, nil
	}
	steps, err := db.Query(ctx, `
		SELECT turn_id, epoch, step, run_id, answer, created_at FROM agent_steps
		WHERE conversation_id = $1 AND turn_id = ANY($2) ORDER BY turn_id, epoch, step`, key, turnIDs)
	if err != nil {
		return nil, fmt.Errorf("read the steps of %s: %w", key, err)
	}
	stepRows, err := pgx.CollectRows(steps, func(row pgx.CollectableRow) (StepRow, error) {
		var s StepRow
		err := row.Scan(&s.TurnID, &s.Epoch, &s.Step, &s.RunID, &s.Answer, &s.CreatedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the steps of %s: %w", key, err)
	}
	for _, s := range stepRows {
		if k, ok := index[s.TurnID]; ok {
			turns[k].Steps = append(turns[k].Steps, s)
		}
	}
	ops, err := readOperations(ctx, db, `o.conversation_id = $1 AND (o.run_id = ANY($2) OR o.turn_id = ANY($3))`, key, runIDs, turnIDs)
	if err != nil {
		return nil, err
	}
	runTurn := map[string]string{}
	for _, r := range runs {
		runTurn[r.ID] = r.TurnID
	}
	for _, o := range ops {
		turn := o.TurnID
		if turn == "" {
			turn = runTurn[o.RunID]
		}
		if k, ok := index[turn]; ok {
			turns[k].Operations = append(turns[k].Operations, o)
		}
	}
	approvals, err := db.Query(ctx, `
		SELECT id, public_id, kind, run_id, turn_id, operation_id, tool, arguments, question, answer, status, created_at, expires_at, decided_at
		FROM approvals WHERE conversation_id = $1 AND turn_id = ANY($2) ORDER BY id`, key, turnIDs)
	if err != nil {
		return nil, fmt.Errorf("read the approvals of %s: %w", key, err)
	}
	apRows, err := pgx.CollectRows(approvals, func(row pgx.CollectableRow) (ApprovalRow, error) {
		var a ApprovalRow
		err := row.Scan(&a.ID, &a.PublicID, &a.Kind, &a.RunID, &a.TurnID, &a.OperationID, &a.Tool, &a.Arguments, &a.Question, &a.Answer,
			&a.Status, &a.CreatedAt, &a.ExpiresAt, &a.DecidedAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the approvals of %s: %w", key, err)
	}
	for _, a := range apRows {
		if k, ok := index[a.TurnID]; ok {
			turns[k].Approvals = append(turns[k].Approvals, a)
		}
	}
	// Newest turn first.
	sort.SliceStable(turns, func(i, j int) bool {
		return turns[i].Runs[0].StartedAt.After(turns[j].Runs[0].StartedAt)
	})
	return turns, nil
}

func scanRunRow(row pgx.CollectableRow) (RunRow, error) {
	var r RunRow
	err := row.Scan(&r.ID, &r.TurnID, &r.OutboxIDs, &r.Worker, &r.Status, &r.Error, &r.ReplyMessageID,
		&r.StartedAt, &r.FinishedAt, &r.LeaseExpiresAt, &r.ConversationKey)
	return r, err
}

// readOperations reads the operations (aliased o) that where selects.
func readOperations(ctx context.Context, db Executor, where string, args ...any) ([]OperationRow, error) {
	rows, err := db.Query(ctx, `
		SELECT o.id, o.run_id, coalesce(o.turn_id, ''), o.epoch, o.step, o.tool_call_id, o.tool, o.effect, o.status,
		       coalesce(o.idempotency_key, ''), o.arguments::text, coalesce(o.result, ''), coalesce(o.error, ''),
		       coalesce(o.message_id, ''), coalesce(o.outcome_recorded_by, ''), o.started_at, o.finished_at
		FROM operations o WHERE `+where+` ORDER BY o.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("read operations: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OperationRow, error) {
		var o OperationRow
		var effect string
		err := row.Scan(&o.ID, &o.RunID, &o.TurnID, &o.Epoch, &o.Step, &o.ToolCallID, &o.Tool, &effect, &o.Status,
			&o.IdempotencyKey, &o.Arguments, &o.Result, &o.Error, &o.MessageID, &o.OutcomeRecordedBy, &o.StartedAt, &o.FinishedAt)
		o.Effect = Effect(effect)
		return o, err
	})
}

// FailedTurn is a turn that gave up visibly and was not retried since:
// its rows are in error.
type FailedTurn struct {
	Conversation ConversationRow
	// RunID is the run that gave up; TurnID its turn. Empty when the run
	// was pruned.
	RunID, TurnID string
	OutboxIDs     []int64
	FailedAt      time.Time
	// Error is the run's account of why.
	Error string
	// Journaled: the turn's steps are journaled, and a retry by an
	// operator who recorded an unknown outcome goes on from them.
	Journaled bool
	// Writes are the turn's writes whose outcome is unknown, and those
	// whose outcome an operator recorded.
	Writes []OperationRow
}

// UnknownWrites are the writes an operator must say what became of before
// the turn can go on.
func (f FailedTurn) UnknownWrites() []OperationRow {
	var out []OperationRow
	for _, o := range f.Writes {
		if o.OutcomeUnknown() {
			out = append(out, o)
		}
	}
	return out
}

// OutcomeRecorded reports whether an operator recorded the outcome of one
// of the turn's writes: a retry then goes on from the journal.
func (f FailedTurn) OutcomeRecorded() bool {
	for _, o := range f.Writes {
		if o.OutcomeRecordedBy != "" {
			return true
		}
	}
	return false
}

// FailedCursor is where a page of failed turns ends.
type FailedCursor struct {
	At time.Time
	ID int64
}

// FailedTurns lists the failed turns, the most recent failure first: the
// rows in error after the cursor (nil: the newest), up to limit rows,
// gathered by the run that failed them. The failed rows' partial index
// finds them.
func FailedTurns(ctx context.Context, db Executor, after *FailedCursor, limit int) ([]FailedTurn, *FailedCursor, error) {
	at, id := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), int64(math.MaxInt64)
	if after != nil {
		at, id = after.At, after.ID
	}
	rows, err := db.Query(ctx, `
		SELECT o.id, o.conversation_id, coalesce(o.run_id, ''), o.processed_at, o.steps_turn_id IS NOT NULL
		FROM agent_outbox o
		WHERE o.status = 'error' AND (o.processed_at, o.id) < ($1, $2)
		ORDER BY o.processed_at DESC, o.id DESC LIMIT $3`, at, id, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("list failed rows: %w", err)
	}
	type failedRow struct {
		id           int64
		conversation string
		run          string
		at           time.Time
		journaled    bool
	}
	failed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (failedRow, error) {
		var f failedRow
		var processed *time.Time
		err := row.Scan(&f.id, &f.conversation, &f.run, &processed, &f.journaled)
		if processed != nil {
			f.at = *processed
		}
		return f, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list failed rows: %w", err)
	}
	var next *FailedCursor
	if len(failed) > limit {
		failed = failed[:limit]
		last := failed[len(failed)-1]
		next = &FailedCursor{At: last.at, ID: last.id}
	}
	var turns []FailedTurn
	index := map[string]int{}
	var runIDs, keys []string
	for _, f := range failed {
		k := f.conversation + "\x00" + f.run
		i, ok := index[k]
		if !ok {
			i = len(turns)
			index[k] = i
			turns = append(turns, FailedTurn{Conversation: ConversationRow{Key: f.conversation}, RunID: f.run, FailedAt: f.at})
			runIDs = append(runIDs, f.run)
			keys = append(keys, f.conversation)
		}
		turns[i].OutboxIDs = append(turns[i].OutboxIDs, f.id)
		turns[i].Journaled = turns[i].Journaled || f.journaled
	}
	if len(turns) == 0 {
		return nil, next, nil
	}
	convs, err := db.Query(ctx, `
		SELECT `+conversationRowColumns+`
		FROM conversations c LEFT JOIN users u ON u.id = c.owner_id WHERE c.id = ANY($1)`, keys)
	if err != nil {
		return nil, nil, fmt.Errorf("read failed turns' conversations: %w", err)
	}
	convRows, err := pgx.CollectRows(convs, scanConversationRow)
	if err != nil {
		return nil, nil, fmt.Errorf("read failed turns' conversations: %w", err)
	}
	byKey := map[string]ConversationRow{}
	for _, c := range convRows {
		byKey[c.Key] = c
	}
	runRows, err := db.Query(ctx, `
		SELECT id, turn_id, outbox_ids, worker, status, coalesce(error, ''), coalesce(reply_message_id, ''),
		       started_at, finished_at, lease_expires_at, conversation_id
		FROM agent_runs WHERE id = ANY($1)`, runIDs)
	if err != nil {
		return nil, nil, fmt.Errorf("read failed turns' runs: %w", err)
	}
	rs, err := pgx.CollectRows(runRows, scanRunRow)
	if err != nil {
		return nil, nil, fmt.Errorf("read failed turns' runs: %w", err)
	}
	byRun := map[string]RunRow{}
	for _, r := range rs {
		byRun[r.ID] = r
	}
	var turnIDs []string
	for i := range turns {
		t := &turns[i]
		if c, ok := byKey[t.Conversation.Key]; ok {
			t.Conversation = c
		}
		if r, ok := byRun[t.RunID]; ok {
			t.TurnID, t.Error = r.TurnID, r.Error
		}
		turnIDs = append(turnIDs, t.TurnID)
	}
	ops, err := readOperations(ctx, db, `o.conversation_id = ANY($1) AND (o.run_id = ANY($2) OR o.turn_id = ANY($3))
		AND o.effect = 'write' AND (o.status IN ('started', 'unknown') OR o.outcome_recorded_by IS NOT NULL)`, keys, runIDs, turnIDs)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range ops {
		for i := range turns {
			t := &turns[i]
			if t.Conversation.Key == "" || (o.RunID != t.RunID && (o.TurnID == "" || o.TurnID != t.TurnID)) {
				continue
			}
			t.Writes = append(t.Writes, o)
		}
	}
	return turns, next, nil
}

// FailedTurnOf returns the conversation's failed turn: its rows in error,
// by the run that failed the newest of them. ErrNotFound when none is.
func FailedTurnOf(ctx context.Context, db Executor, key string) (FailedTurn, error) {
	var run string
	err := db.QueryRow(ctx, `
		SELECT coalesce(run_id, '') FROM agent_outbox WHERE conversation_id = $1 AND status = 'error'
		ORDER BY id DESC LIMIT 1`, key).Scan(&run)
	if errors.Is(err, pgx.ErrNoRows) {
		return FailedTurn{}, ErrNotFound
	}
	if err != nil {
		return FailedTurn{}, fmt.Errorf("read the failed turn of %s: %w", key, err)
	}
	var at *time.Time
	t := FailedTurn{RunID: run}
	if err := db.QueryRow(ctx, `
		SELECT array_agg(id ORDER BY id), max(processed_at), bool_or(steps_turn_id IS NOT NULL)
		FROM agent_outbox WHERE conversation_id = $1 AND status = 'error' AND run_id IS NOT DISTINCT FROM nullif($2, '')`,
		key, run).Scan(&t.OutboxIDs, &at, &t.Journaled); err != nil {
		return t, fmt.Errorf("read the failed turn of %s: %w", key, err)
	}
	if at != nil {
		t.FailedAt = *at
	}
	if t.Conversation, err = ConversationByKeyAny(ctx, db, key); err != nil {
		return t, err
	}
	var turnID, cause *string
	err = db.QueryRow(ctx, `SELECT turn_id, error FROM agent_runs WHERE id = $1`, run).Scan(&turnID, &cause)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("read the failed turn of %s: %w", key, err)
	}
	if turnID != nil {
		t.TurnID = *turnID
	}
	if cause != nil {
		t.Error = *cause
	}
	t.Writes, err = readOperations(ctx, db, `o.conversation_id = $1 AND (o.run_id = $2 OR o.turn_id = $3)
		AND o.effect = 'write' AND (o.status IN ('started', 'unknown') OR o.outcome_recorded_by IS NOT NULL)`, key, run, t.TurnID)
	return t, err
}

// Kinds of stuck turns.
const (
	// StuckLease: a run holds the conversation past its lease's expiry
	// and no worker took it over.
	StuckLease = "lease"
	// StuckPending: a message waits for a turn past the sweep.
	StuckPending = "pending"
	// StuckApproval: a call or a question waits for a person's decision
	// longer than the console's setting.
	StuckApproval = "approval"
)

// StuckTurn is a conversation whose turn is not moving.
type StuckTurn struct {
	Kind         string
	Conversation ConversationRow
	// Since is when it became stuck: the lease's expiry, the row's last
	// announcement, the approval's creation.
	Since time.Time
	// RunID and Worker are the run that holds the lease; Detail says more
	// (the approval's tool, the rows waiting).
	RunID, Worker string
	Detail        string
}

// StuckOptions say when a turn counts as stuck.
type StuckOptions struct {
	// LeaseGrace: how long past its expiry a lease may stay held.
	LeaseGrace time.Duration
	// PendingAfter: how long a row may wait unannounced and unclaimed.
	PendingAfter time.Duration
	// ApprovalAfter: how long an approval may wait for its decision.
	ApprovalAfter time.Duration
	// Limit bounds each kind's list.
	Limit int
}

// StuckTurns lists the stuck turns of each kind, the longest stuck first,
// each through the partial index of its kind (held leases, pending rows
// by their last announcement, pending approvals).
func StuckTurns(ctx context.Context, db Executor, o StuckOptions) ([]StuckTurn, error) {
	var out []StuckTurn
	rows, err := db.Query(ctx, `
		SELECT `+conversationRowColumns+`, c.lease_expires_at, coalesce(r.worker, '')
		FROM conversations c LEFT JOIN users u ON u.id = c.owner_id LEFT JOIN agent_runs r ON r.id = c.run_id
		WHERE c.run_id IS NOT NULL AND c.lease_expires_at < now() - $1::interval
		ORDER BY c.lease_expires_at LIMIT $2`, o.LeaseGrace, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("list held leases: %w", err)
	}
	leases, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StuckTurn, error) {
		s := StuckTurn{Kind: StuckLease}
		c := &s.Conversation
		err := row.Scan(&c.Key, &c.PublicID, &c.OwnerID, &c.Owner, &c.Title, &c.CreatedAt, &c.UpdatedAt,
			&c.LastMessageAt, &c.RunID, &c.LeaseExpiresAt, &c.ApprovalID, &s.Since, &s.Worker)
		s.RunID = c.RunID
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list held leases: %w", err)
	}
	out = append(out, leases...)

	// Pending rows nobody claimed since their last announcement, of
	// conversations that do not wait on purpose (for an approval, for the
	// model server's Retry-After) and that no live run holds.
	rows, err = db.Query(ctx, `
		SELECT `+conversationRowColumns+`, min(coalesce(o.announced_at, o.created_at)), count(*)
		FROM agent_outbox o JOIN conversations c ON c.id = o.conversation_id LEFT JOIN users u ON u.id = c.owner_id
		WHERE o.status = 'pending' AND coalesce(o.announced_at, o.created_at) < now() - $1::interval
		  AND c.approval_id IS NULL AND coalesce(c.not_before <= now(), true)
		  AND (c.run_id IS NULL OR c.lease_expires_at < now())
		GROUP BY c.id, u.name
		ORDER BY 12 LIMIT $2`, o.PendingAfter, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("list pending rows: %w", err)
	}
	pending, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StuckTurn, error) {
		s := StuckTurn{Kind: StuckPending}
		c := &s.Conversation
		var n int64
		err := row.Scan(&c.Key, &c.PublicID, &c.OwnerID, &c.Owner, &c.Title, &c.CreatedAt, &c.UpdatedAt,
			&c.LastMessageAt, &c.RunID, &c.LeaseExpiresAt, &c.ApprovalID, &s.Since, &n)
		s.Detail = fmt.Sprintf("%d message(s) waiting", n)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list pending rows: %w", err)
	}
	out = append(out, pending...)

	rows, err = db.Query(ctx, `
		SELECT `+conversationRowColumns+`, a.created_at, a.run_id, a.kind, a.tool
		FROM approvals a JOIN conversations c ON c.id = a.conversation_id LEFT JOIN users u ON u.id = c.owner_id
		WHERE a.status = 'pending' AND a.created_at < now() - $1::interval
		ORDER BY a.created_at LIMIT $2`, o.ApprovalAfter, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("list waiting approvals: %w", err)
	}
	approvals, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StuckTurn, error) {
		s := StuckTurn{Kind: StuckApproval}
		c := &s.Conversation
		var kind, tool string
		err := row.Scan(&c.Key, &c.PublicID, &c.OwnerID, &c.Owner, &c.Title, &c.CreatedAt, &c.UpdatedAt,
			&c.LastMessageAt, &c.RunID, &c.LeaseExpiresAt, &c.ApprovalID, &s.Since, &s.RunID, &kind, &tool)
		s.Detail = "a call of " + tool + " waits for its decision"
		if kind == "question" {
			s.Detail = "a question waits for its answer"
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list waiting approvals: %w", err)
	}
	return append(out, approvals...), nil
}
