package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Check names of the MCP part of the verdict.
const (
	CheckMCPTwice    = "MCP calls received twice or without their key"
	CheckMCPJournal  = "MCP calls received before their journal"
	CheckMCPApproval = "approvals not kept"
	CheckMCPWaiting  = "turns stuck on a decided approval"
)

// mcpOperation is what the journal says of an MCP call at the end.
type mcpOperation struct {
	status  string
	started time.Time
}

// mcpApproval is an approval at the end, with its call and its turn.
type mcpApproval struct {
	id, status string
	// key and opStatus are the call's idempotency key and its
	// operation's status.
	key, opStatus    string
	created, decided time.Time
	// open counts the turn's outbox rows not done or error; done those
	// done (answered by a reply); stopped those a stop settled (done, and
	// answered by no turn).
	open, done, stopped int
}

// loadMCP reads the MCP operations (by idempotency key) and every
// approval.
func loadMCP(ctx context.Context, pool *pgxpool.Pool) (map[string]mcpOperation, []mcpApproval, error) {
	ops := map[string]mcpOperation{}
	rows, err := pool.Query(ctx, `SELECT idempotency_key, status, started_at FROM operations WHERE tool = ANY($1)`,
		[]string{mcpShipTool, mcpRefundTool})
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var key string
		var op mcpOperation
		if err := rows.Scan(&key, &op.status, &op.started); err != nil {
			rows.Close()
			return nil, nil, err
		}
		ops[key] = op
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var approvals []mcpApproval
	rows, err = pool.Query(ctx, `
		SELECT a.public_id, a.status, coalesce(o.idempotency_key, ''), coalesce(o.status, ''), a.created_at,
			coalesce(a.decided_at, now() + interval '100 years'),
			(SELECT count(*) FROM agent_outbox x WHERE x.id = ANY(a.outbox_ids) AND x.status NOT IN ('done', 'error')),
			(SELECT count(*) FROM agent_outbox x WHERE x.id = ANY(a.outbox_ids) AND x.status = 'done' AND x.stopped_at IS NULL),
			(SELECT count(*) FROM agent_outbox x WHERE x.id = ANY(a.outbox_ids) AND x.stopped_at IS NOT NULL)
		FROM approvals a LEFT JOIN operations o ON o.id = a.operation_id
		ORDER BY a.id`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var a mcpApproval
		if err := rows.Scan(&a.id, &a.status, &a.key, &a.opStatus, &a.created, &a.decided, &a.open, &a.done, &a.stopped); err != nil {
			rows.Close()
			return nil, nil, err
		}
		approvals = append(approvals, a)
	}
	rows.Close()
	return ops, approvals, rows.Err()
}

// mcpReport is what the summary says of the MCP calls and approvals.
type mcpReport struct {
	// Calls the server received, of each tool, under Keys keys.
	Calls, Ship, Refund, Keys int
	// Dropped and Held by the MCP faults; InFlightKills are calls whose
	// worker was killed (by any fault) while they were in flight.
	Dropped, Held, InFlightKills int
	// AtArrival were journaled as started when they arrived (read then);
	// ByTime were judged by the time their operation started (PostgreSQL
	// could not be read as they arrived); Unverified by neither (their
	// conversation was deleted since).
	AtArrival, ByTime, Unverified int

	// Approvals by their end: Approved, of which Ran (the call arrived
	// once and completed), Cut (it arrived once and its outcome was lost
	// to a fault), NotSent (the turn failed before it was sent) and
	// Stopped (a stop came before the turn went on: never sent); Denied,
	// Expired and Pending.
	Asked, Approved, Ran, Cut, NotSent, Stopped, Denied, Expired, Pending int
	// WaitKills are worker kills while at least one approval waited, of
	// Kills; MostWaiting the most approvals waiting at one kill.
	WaitKills, Kills, MostWaiting int
	// Load is what the load did with the approvals.
	Load approvalTally
}

func (r mcpReport) calls() string {
	return fmt.Sprintf("%d received (%s %d, %s %d) under %d keys; %d dropped and %d held by a fault, %d in flight when their worker was killed",
		r.Calls, mcpShipTool, r.Ship, mcpRefundTool, r.Refund, r.Keys, r.Dropped, r.Held, r.InFlightKills)
}

func (r mcpReport) journal() string {
	return fmt.Sprintf("%d journaled as started when they arrived (read then), %d started before they arrived (PostgreSQL away then), %d unverifiable",
		r.AtArrival, r.ByTime, r.Unverified)
}

func (r mcpReport) approvals() string {
	return fmt.Sprintf("%d asked: %d approved (%d ran once, %d cut off in flight, %d not sent: turn failed first, %d not sent: turn stopped first), %d denied, %d expired, %d pending; the load found %d, approved %d, denied %d, left %d to expire, %d too late, %d never showed",
		r.Asked, r.Approved, r.Ran, r.Cut, r.NotSent, r.Stopped, r.Denied, r.Expired, r.Pending,
		r.Load.Found, r.Load.Approved, r.Load.Denied, r.Load.Left, r.Load.Late, r.Load.Unseen)
}

func (r mcpReport) waitKills() string {
	return fmt.Sprintf("%d of %d worker kills (up to %d approvals waiting at one)", r.WaitKills, r.Kills, r.MostWaiting)
}

// workerKills are the faults that killed a worker, with the worker and
// when it died.
func workerKills(faults []faultRecord) []faultRecord {
	var out []faultRecord
	for _, f := range faults {
		if _, crash := f.kind.crashPoint(); crash || f.kind == FaultWorkerKill || ((f.kind == FaultMCPCallKill || f.kind == FaultAgentStepKill) && !f.failed) {
			out = append(out, f)
		}
	}
	return out
}

// judgeMCP checks the calls the MCP server received against the journal
// and the approvals: every idempotency key arrived at most once, with the
// same key in _meta and the header; every call was journaled as started
// before it arrived; an approved call arrived at most once (once when its
// operation completed), a denied or expired one never; no approval was
// sent while it waited; no turn is left waiting on a decided approval.
// decided are the statuses the API answered to the load's decisions.
func judgeMCP(calls []mcpCall, ops map[string]mcpOperation, approvals []mcpApproval, decided map[string]string, faults []faultRecord) ([]*Check, mcpReport) {
	twice := &Check{Name: CheckMCPTwice}
	journal := &Check{Name: CheckMCPJournal}
	kept := &Check{Name: CheckMCPApproval}
	waiting := &Check{Name: CheckMCPWaiting}
	var r mcpReport
	kills := workerKills(faults)
	byKey := map[string][]mcpCall{}
	describe := func(c mcpCall) string {
		return fmt.Sprintf("%s %q from %s at %s", c.tool, c.text, c.worker, c.arrived.Format("15:04:05.000"))
	}
	for _, c := range calls {
		r.Calls++
		switch c.tool {
		case mcpShip:
			r.Ship++
		case mcpRefund:
			r.Refund++
		}
		if c.dropped {
			r.Dropped++
		}
		if c.held {
			r.Held++
		}
		for _, k := range kills {
			if k.target == c.worker && !k.at.Before(c.arrived) && !k.at.After(c.answered) {
				r.InFlightKills++
				break
			}
		}
		if c.metaKey == "" || c.headerKey != c.metaKey {
			twice.add("%s came with the _meta key %q and the Idempotency-Key header %q", describe(c), c.metaKey, c.headerKey)
		}
		byKey[c.metaKey] = append(byKey[c.metaKey], c)
		switch c.journal {
		case "":
			journal.add("%s (key %s) arrived with no operation journaled", describe(c), c.metaKey)
		case journalUnread:
			op, ok := ops[c.metaKey]
			switch {
			case !ok:
				r.Unverified++
			case op.started.After(c.arrived):
				journal.add("%s (key %s) arrived before its operation was started, at %s", describe(c), c.metaKey, op.started.Format("15:04:05.000"))
			default:
				r.ByTime++
			}
		case "awaiting_approval", "denied":
			kept.add("%s (key %s) arrived while its operation was %s: sent without an approval", describe(c), c.metaKey, c.journal)
		default:
			r.AtArrival++
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		cs := byKey[k]
		if k == "" || len(cs) < 2 {
			continue
		}
		var seen []string
		for _, c := range cs {
			seen = append(seen, describe(c))
		}
		twice.add("key %s reached the server %d times: %s", k, len(cs), strings.Join(seen, "; "))
	}
	r.Keys = len(byKey)
	// The receiver's count: every ship and refund argument is unique to
	// the message that asked for it, so one that arrived under two keys is
	// one action taken twice, by two calls the journal told apart (a step
	// asked again, whose new answer named the call anew).
	byText := map[string]map[string]bool{}
	for _, c := range calls {
		t := c.tool + " " + c.text
		if byText[t] == nil {
			byText[t] = map[string]bool{}
		}
		byText[t][c.metaKey] = true
	}
	texts := make([]string, 0, len(byText))
	for t := range byText {
		texts = append(texts, t)
	}
	slices.Sort(texts)
	for _, t := range texts {
		if len(byText[t]) > 1 {
			twice.add("%s reached the server under %d keys: %s", t, len(byText[t]), strings.Join(sortedKeys(byText[t]), ", "))
		}
	}

	for _, a := range approvals {
		r.Asked++
		n := len(byKey[a.key])
		if a.key == "" {
			n = 0
		}
		if said, ok := decided[a.id]; ok && said != a.status {
			kept.add("approval %s was answered %s to its user but is %s in the database", a.id, said, a.status)
		}
		switch a.status {
		case "approved":
			r.Approved++
			if a.stopped > 0 && a.opStatus == "denied" && n == 0 {
				// A stop came after the decision, before the turn went
				// on: the call is recorded as never sent, and was not.
				r.Stopped++
				break
			}
			switch {
			case a.opStatus == "completed" && n == 0:
				kept.add("approved call of %s (key %s) is journaled completed but never reached the server", a.id, a.key)
			case a.done > 0 && a.opStatus != "completed":
				kept.add("the turn of approval %s was answered, but its approved call is %s", a.id, a.opStatus)
			case a.opStatus == "denied":
				kept.add("approved call of %s (key %s) was not sent after all", a.id, a.key)
			}
			switch {
			case n == 1 && a.opStatus == "completed":
				r.Ran++
			case n == 1:
				r.Cut++
			case n == 0:
				r.NotSent++
			}
		case "denied", "expired":
			if a.status == "denied" {
				r.Denied++
			} else {
				r.Expired++
			}
			if n > 0 {
				kept.add("%s call of approval %s (key %s) reached the server %d times", a.status, a.id, a.key, n)
			}
			if a.opStatus != "denied" {
				kept.add("the call of %s approval %s is journaled %s, not denied", a.status, a.id, a.opStatus)
			}
		default:
			r.Pending++
			waiting.add("approval %s still waits after the run (%d of its turn's rows open)", a.id, a.open)
		}
		if a.status != "pending" && a.open > 0 {
			waiting.add("approval %s was %s at %s, but %d of its turn's rows are still open", a.id, a.status, a.decided.Format("15:04:05.000"), a.open)
		}
	}
	r.Kills = len(kills)
	for _, k := range kills {
		n := 0
		for _, a := range approvals {
			if !k.at.Before(a.created) && k.at.Before(a.decided) {
				n++
			}
		}
		if n > 0 {
			r.WaitKills++
		}
		r.MostWaiting = max(r.MostWaiting, n)
	}
	return []*Check{twice, journal, kept, waiting}, r
}
