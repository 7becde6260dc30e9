package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// maxNamed bounds how many offending rows one check names.
const maxNamed = 20

// Check is one invariant and what broke it.
type Check struct {
	Name string
	// Count of offending rows (0 passes).
	Count int
	// Rows names up to 20 offenders.
	Rows []string
}

func (c *Check) add(format string, args ...any) {
	c.Count++
	if len(c.Rows) < maxNamed {
		c.Rows = append(c.Rows, fmt.Sprintf(format, args...))
	}
}

// Verdict is the judgement of a run from the database.
type Verdict struct {
	Checks []*Check

	// Figures of the summary.
	UserMessages, Replies, Errors int
	RepliedTurns, FailedTurns     int
	SideEffects                   int
	// SettledByStop are rows a stop settled while they waited: done,
	// answered by no turn.
	SettledByStop int
	Runs          map[string]int
	// LongestRecovery is the longest time from a fault to the next
	// finalized turn, and the fault.
	LongestRecovery      time.Duration
	LongestRecoveryAfter string
	// NoTurnAfter counts faults no finalized turn followed.
	NoTurnAfter int
}

// Passed reports whether every check passed.
func (v *Verdict) Passed() bool {
	for _, c := range v.Checks {
		if c.Count > 0 {
			return false
		}
	}
	return true
}

// Check names, as the summary prints them.
const (
	CheckLost            = "lost messages"
	CheckStuck           = "stuck rows"
	CheckDoneNoReply     = "done rows without a reply"
	CheckErrorNoMessage  = "error rows without a visible error"
	CheckDuplicateReply  = "duplicated replies"
	CheckDuplicateEffect = "duplicated side effects"
	CheckOverlap         = "overlapping runs"
	CheckDeleted         = "rows left in deleted conversations"
	CheckRetry           = "retries that made a second turn"
	CheckClient          = "unexpected API answers"
	CheckHungShutdown    = "postgres shutdowns that hung"
	CheckFaultNotCarried = "faults not carried out"
	CheckStatus          = "baton status after the run"
	CheckLiveStreams     = "live event streams with a gap or a repeat"
)

func (v *Verdict) check(name string) *Check {
	for _, c := range v.Checks {
		if c.Name == name {
			return c
		}
	}
	c := &Check{Name: name}
	v.Checks = append(v.Checks, c)
	return c
}

// judge computes the verdict from the database and what the client saw.
func judge(ctx context.Context, pool *pgxpool.Pool, plan *loadPlan, cl *client, faults []faultRecord) (*Verdict, error) {
	v := &Verdict{Runs: map[string]int{}}
	for _, n := range []string{CheckLost, CheckStuck, CheckDoneNoReply, CheckErrorNoMessage, CheckDuplicateReply,
		CheckDuplicateEffect, CheckOverlap, CheckDeleted, CheckRetry, CheckClient} {
		v.check(n)
	}
	deleted := cl.deletedConversations()

	// Every outbox row, with the visible outcomes (replies and errors)
	// whose runs covered it.
	type outboxRow struct {
		id            int64
		conversation  string
		message       string
		status        string
		attempts      int
		replies, errs []string
		emptyError    bool
		// stopped: a stop settled the row while it waited for a turn;
		// no turn answers it.
		stopped bool
	}
	rows := map[int64]*outboxRow{}
	byMessage := map[string][]*outboxRow{}
	// The client knows conversations and messages by their own ids.
	q, err := pool.Query(ctx, `
		SELECT o.id, c.public_id, coalesce(m.public_id, m.id), o.status, o.attempts, o.stopped_at IS NOT NULL
		FROM agent_outbox o JOIN messages m ON m.id = o.message_id JOIN conversations c ON c.id = o.conversation_id`)
	if err != nil {
		return nil, err
	}
	for q.Next() {
		r := &outboxRow{}
		if err := q.Scan(&r.id, &r.conversation, &r.message, &r.status, &r.attempts, &r.stopped); err != nil {
			q.Close()
			return nil, err
		}
		rows[r.id] = r
		byMessage[r.message] = append(byMessage[r.message], r)
	}
	q.Close()
	if err := q.Err(); err != nil {
		return nil, err
	}
	q, err = pool.Query(ctx, `
		SELECT oid, m.id, m.role, length(trim(m.content)) = 0
		FROM messages m JOIN agent_runs r ON r.id = m.run_id CROSS JOIN unnest(r.outbox_ids) AS oid
		WHERE m.role IN ('assistant', 'error')`)
	if err != nil {
		return nil, err
	}
	for q.Next() {
		var oid int64
		var id, role string
		var empty bool
		if err := q.Scan(&oid, &id, &role, &empty); err != nil {
			q.Close()
			return nil, err
		}
		r := rows[oid]
		if r == nil {
			continue
		}
		if role == "assistant" {
			r.replies = append(r.replies, id)
		} else {
			r.errs = append(r.errs, id)
			r.emptyError = r.emptyError || empty
		}
	}
	q.Close()
	if err := q.Err(); err != nil {
		return nil, err
	}
	ids := make([]int64, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		r := rows[id]
		outcomes := len(r.replies) + len(r.errs)
		switch r.status {
		case "done":
			if r.stopped {
				v.SettledByStop++
			}
			if len(r.replies) == 0 && !r.stopped {
				v.check(CheckDoneNoReply).add("outbox %d (message %s, conversation %s) is done with no assistant reply", r.id, r.message, r.conversation)
			}
		case "error":
			if len(r.errs) == 0 || r.emptyError {
				v.check(CheckErrorNoMessage).add("outbox %d (message %s, conversation %s) is error with no visible error message", r.id, r.message, r.conversation)
			}
		default:
			v.check(CheckStuck).add("outbox %d (message %s, conversation %s) is still %s after %d attempts", r.id, r.message, r.conversation, r.status, r.attempts)
		}
		if outcomes > 1 {
			v.check(CheckDuplicateReply).add("outbox %d (message %s, conversation %s) has %d outcomes: replies %v, errors %v", r.id, r.message, r.conversation, outcomes, r.replies, r.errs)
		}
	}

	// Runs: still running at the end, and overlaps. A run owns its
	// conversation from its claim (started_at) until the transaction that
	// releases it (finished_at): finalized, failed and recovered runs, and
	// those that stopped to wait for an approval, all ended in such a
	// transaction, under the conversation's row lock. Two
	// such intervals of one conversation must not intersect. Cancelled and
	// abandoned runs had already lost the conversation when they were
	// marked, so their finished_at says nothing about ownership.
	q, err = pool.Query(ctx, `SELECT status, count(*) FROM agent_runs GROUP BY status`)
	if err != nil {
		return nil, err
	}
	for q.Next() {
		var s string
		var n int
		if err := q.Scan(&s, &n); err != nil {
			q.Close()
			return nil, err
		}
		v.Runs[s] = n
	}
	q.Close()
	if err := q.Err(); err != nil {
		return nil, err
	}
	if err := eachRow(ctx, pool, `
		SELECT id, conversation_id, started_at::text FROM agent_runs WHERE status = 'running'`, func(s []string) {
		v.check(CheckStuck).add("run %s of conversation %s is still running (started %s)", s[0], s[1], s[2])
	}); err != nil {
		return nil, err
	}
	if err := eachRow(ctx, pool, `
		SELECT a.id, a.status, b.id, b.status, a.conversation_id,
			a.started_at::text || ' .. ' || a.finished_at::text, b.started_at::text || ' .. ' || b.finished_at::text
		FROM agent_runs a JOIN agent_runs b
			ON a.conversation_id = b.conversation_id AND a.id < b.id
		WHERE a.status IN ('finalized', 'failed', 'recovered', 'superseded', 'waiting_for_approval')
			AND b.status IN ('finalized', 'failed', 'recovered', 'superseded', 'waiting_for_approval')
			AND a.started_at < b.finished_at AND b.started_at < a.finished_at`, func(s []string) {
		v.check(CheckOverlap).add("runs %s (%s, %s) and %s (%s, %s) of conversation %s overlapped", s[0], s[1], s[5], s[2], s[3], s[6], s[4])
	}); err != nil {
		return nil, err
	}
	// A run that journaled a tool call after it lost the conversation
	// acted beside its successor.
	if err := eachRow(ctx, pool, `
		SELECT o.id::text, o.tool, r.id, r.status, o.started_at::text, r.finished_at::text
		FROM operations o JOIN agent_runs r ON r.id = o.run_id
		WHERE r.finished_at IS NOT NULL AND o.started_at > r.finished_at`, func(s []string) {
		v.check(CheckOverlap).add("operation %s (%s) of run %s (%s) started at %s, after the run ended at %s", s[0], s[1], s[2], s[3], s[4], s[5])
	}); err != nil {
		return nil, err
	}

	// Side effects: one row per execution. The load's notify texts are
	// unique per message, so two rows of one text are one action taken
	// twice, whichever runs took it.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM tool_side_effects`).Scan(&v.SideEffects); err != nil {
		return nil, err
	}
	if err := eachRow(ctx, pool, `
		SELECT payload, count(*)::text, string_agg(DISTINCT idempotency_key, ','), conversation_id
		FROM tool_side_effects GROUP BY payload, conversation_id HAVING count(*) > 1`, func(s []string) {
		v.check(CheckDuplicateEffect).add("notify %q in conversation %s executed %s times (idempotency keys %s)", s[0], s[3], s[1], s[2])
	}); err != nil {
		return nil, err
	}

	// Deleted conversations: nothing of them may remain or come back. The
	// client knows them by its ids; their keys are gone with them, so what
	// could remain is a row whose conversation no longer exists.
	for conv := range deleted {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM conversations WHERE public_id = $1`, conv).Scan(&n); err != nil {
			return nil, err
		}
		if n != 0 {
			v.check(CheckDeleted).add("deleted conversation %s came back", conv)
		}
	}
	var orphans [4]int
	if err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM messages x WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = x.conversation_id)),
			(SELECT count(*) FROM agent_outbox x WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = x.conversation_id)),
			(SELECT count(*) FROM agent_runs x WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = x.conversation_id)),
			(SELECT count(*) FROM operations x WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = x.conversation_id))`).
		Scan(&orphans[0], &orphans[1], &orphans[2], &orphans[3]); err != nil {
		return nil, err
	}
	if orphans != [4]int{} {
		v.check(CheckDeleted).add("%d message, %d outbox, %d run and %d operation rows remain of conversations that no longer exist", orphans[0], orphans[1], orphans[2], orphans[3])
	}

	// Messages the client saw accepted: each must be in the database with
	// exactly one outbox row, unless its conversation was deleted.
	users := map[string]bool{}
	if err := eachRow(ctx, pool, `SELECT public_id FROM messages WHERE role = 'user'`, func(s []string) { users[s[0]] = true }); err != nil {
		return nil, err
	}
	v.UserMessages = len(users)
	for _, m := range plan.messages {
		m.mu.Lock()
		accepted, created, posts := m.accepted, m.created, m.posts
		m.mu.Unlock()
		if _, gone := deleted[m.conversation]; gone {
			continue
		}
		if accepted && (!users[m.id] || len(byMessage[m.id]) == 0) {
			v.check(CheckLost).add("message %s of conversation %s was accepted (HTTP 2xx) but has no user message or outbox row", m.id, m.conversation)
		}
		if posts > 1 {
			switch {
			case created > 1:
				v.check(CheckRetry).add("message %s of conversation %s was answered 202 (new) %d times", m.id, m.conversation, created)
			case len(byMessage[m.id]) > 1:
				v.check(CheckRetry).add("message %s of conversation %s has %d outbox rows", m.id, m.conversation, len(byMessage[m.id]))
			case len(byMessage[m.id]) == 1 && len(byMessage[m.id][0].replies)+len(byMessage[m.id][0].errs) > 1:
				v.check(CheckRetry).add("message %s of conversation %s was answered by %d turns", m.id, m.conversation, len(byMessage[m.id][0].replies)+len(byMessage[m.id][0].errs))
			}
		}
	}
	cl.mu.Lock()
	for _, e := range cl.errors {
		v.check(CheckClient).add("%s", e)
	}
	cl.mu.Unlock()

	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE role = 'assistant'), count(*) FILTER (WHERE role = 'error') FROM messages`).Scan(&v.Replies, &v.Errors); err != nil {
		return nil, err
	}
	v.RepliedTurns = v.Runs["finalized"]
	v.FailedTurns = v.Errors

	// Longest time from a fault to the next finalized turn.
	for _, f := range faults {
		var next *time.Time
		if err := pool.QueryRow(ctx, `SELECT min(finished_at) FROM agent_runs WHERE status = 'finalized' AND finished_at > $1`, f.at).Scan(&next); err != nil {
			return nil, err
		}
		if next == nil {
			// Possible only for a fault at the very end of the load; a
			// system wedged by it shows as stuck rows.
			v.NoTurnAfter++
			continue
		}
		if d := next.Sub(f.at); d > v.LongestRecovery {
			v.LongestRecovery = d
			v.LongestRecoveryAfter = fmt.Sprintf("%s of %s at %s", f.kind, f.target, f.at.Format("15:04:05.000"))
		}
	}
	return v, nil
}

// eachRow runs a query whose columns all read as text.
func eachRow(ctx context.Context, pool *pgxpool.Pool, sql string, fn func([]string)) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(strings.Fields(sql), " "), err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return err
		}
		s := make([]string, len(vals))
		for i, v := range vals {
			s[i] = fmt.Sprint(v)
		}
		fn(s)
	}
	return rows.Err()
}
