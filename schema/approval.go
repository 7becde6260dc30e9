package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	batonnats "github.com/batonhq/baton/nats"
)

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalExpired  = "expired"
)

// Errors of approvals.
var (
	// ErrWaitingForApproval: the conversation's turn waits for a person
	// to approve or deny a call; nothing may be claimed until then.
	ErrWaitingForApproval = errors.New("conversation waits for an approval")
	// ErrApprovalDecided: the approval was approved, denied or expired
	// already; a decision is given once.
	ErrApprovalDecided = errors.New("the approval was decided already")
	// ErrArgumentsChanged: the arguments the approval is asked for are
	// not the ones stored, or not the ones the client saw.
	ErrArgumentsChanged = errors.New("the arguments of the call are not the ones shown for approval")
)

// ApprovalWaitError is ErrWaitingForApproval with the approval and until
// when it waits.
type ApprovalWaitError struct {
	ApprovalID string
	ExpiresAt  time.Time
}

func (e *ApprovalWaitError) Error() string {
	return fmt.Sprintf("%s (%s) until %s", ErrWaitingForApproval, e.ApprovalID, e.ExpiresAt.Format(time.RFC3339))
}

func (e *ApprovalWaitError) Unwrap() error { return ErrWaitingForApproval }

// argumentsHashSQL is the SHA-256 of a JSONB value as PostgreSQL writes
// it: the same value always gives the same text, so the hash of arguments
// read back from the journal is the hash they were stored with.
const argumentsHashSQL = `encode(sha256(convert_to(%s::jsonb::text, 'UTF8')), 'hex')`

// ApprovalRequest is a turn stopped at a call that needs a person's
// approval, or at a question its agent asked a person.
type ApprovalRequest struct {
	ConversationID string
	RunID          string
	TurnID         string
	OutboxIDs      []int64
	// Operation is the call, journaled as awaiting approval; it is not
	// sent until approved. Unused for a question.
	Operation Operation
	// Question, when set, is what the agent asked: the turn waits for a
	// person's answer, and no call of Baton's waits. Epoch and Step place
	// it in the turn's journal of steps.
	Question *Question
	Epoch    int
	Step     int
	// State is what the agent needs to resume the turn at this call
	// without asking the model again.
	State json.RawMessage
	// TTL is how long the approval may wait; past it, the call is denied.
	TTL time.Duration
}

// Requested says what RequestApprovalTx committed.
type Requested struct {
	ApprovalID      string
	OperationID     int64
	ArgumentsSHA256 string
	ExpiresAt       time.Time
}

// RequestApprovalTx stops a turn at a call that needs approval, or at a
// question its agent asked, in the caller's transaction, fenced by the
// run's ownership: the call is journaled as awaiting approval with its
// arguments and their hash, an approval row keeps the agent's state (or
// the question), the conversation names that approval and is released,
// the turn's rows go back to pending without the attempt counting, and
// the run ends as waiting_for_approval. Nothing holds the conversation
// while it waits: the decision announces the rows, and any worker's claim
// resumes the turn from the approval. A run that was asked to stop
// (StopTx) does not wait: ErrStopRequested, and nothing is written.
func RequestApprovalTx(ctx context.Context, tx Executor, p ApprovalRequest) (Requested, error) {
	var out Requested
	var stop bool
	err := tx.QueryRow(ctx, `
		SELECT coalesce(stop_run_id = run_id, false) FROM conversations WHERE id = $1 AND run_id = $2 FOR NO KEY UPDATE`,
		p.ConversationID, p.RunID).Scan(&stop)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, ownershipError(ctx, tx, p.ConversationID)
	}
	if err != nil {
		return out, fmt.Errorf("park: lock conversation: %w", err)
	}
	if stop {
		// A stopped turn waits for nothing: the caller ends it stopped,
		// and the call is never journaled, let alone sent.
		return out, ErrStopRequested
	}
	out.ApprovalID = "ap_" + uuid.Must(uuid.NewV7()).String()
	var id int64
	what := ""
	if p.Question != nil {
		id, err = askTx(ctx, tx, p, &out)
		what = "an answer to the agent's question"
	} else {
		id, err = requestCallTx(ctx, tx, p, &out)
		what = fmt.Sprintf("a call of %q", p.Operation.Tool)
	}
	if err != nil {
		return out, err
	}
	if _, err := tx.Exec(ctx, `
		UPDATE conversations SET run_id = NULL, lease_expires_at = NULL, approval_id = $3, updated_at = now()
		WHERE id = $1 AND run_id = $2`, p.ConversationID, p.RunID, id); err != nil {
		return out, fmt.Errorf("park: release conversation: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE agent_outbox SET status = 'pending', attempts = greatest(attempts - 1, 0), run_id = NULL
		WHERE id = ANY($1) AND run_id = $2 AND status = 'processing'`, p.OutboxIDs, p.RunID)
	if err != nil {
		return out, fmt.Errorf("park: rows back to pending: %w", err)
	}
	if tag.RowsAffected() != int64(len(p.OutboxIDs)) {
		return out, fmt.Errorf("%w: %d of %d claimed rows are still processing for run %s", ErrLeaseLost, tag.RowsAffected(), len(p.OutboxIDs), p.RunID)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE agent_runs SET status = 'waiting_for_approval', error = $2, finished_at = clock_timestamp() WHERE id = $1`,
		p.RunID, fmt.Sprintf("waits for the approval %s of %s", out.ApprovalID, what)); err != nil {
		return out, fmt.Errorf("park: record run: %w", err)
	}
	return out, nil
}

// requestCallTx journals the call that waits as awaiting approval, and
// records its approval.
func requestCallTx(ctx context.Context, tx Executor, p ApprovalRequest, out *Requested) (int64, error) {
	op := p.Operation
	err := tx.QueryRow(ctx, fmt.Sprintf(`
		INSERT INTO operations (run_id, conversation_id, tool_call_id, tool, tool_version, effect, idempotency_key,
			arguments, arguments_sha256, definition_sha256, status, turn_id, epoch, step)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, `+argumentsHashSQL+`, $9, 'awaiting_approval', nullif($10, ''),
			CASE WHEN $10 = '' THEN NULL ELSE $11::integer END, CASE WHEN $10 = '' THEN NULL ELSE $12::integer END)
		RETURNING id, arguments_sha256`, "$8"),
		op.RunID, op.ConversationID, op.ToolCallID, op.Tool, op.ToolVersion, string(op.Effect), op.IdempotencyKey,
		op.Arguments, op.DefinitionSHA256, op.TurnID, op.Epoch, op.Step).Scan(&out.OperationID, &out.ArgumentsSHA256)
	if IsUniqueViolation(err) {
		return 0, fmt.Errorf("%w: %q in run %s; give each call its own id", ErrDuplicateToolCall, op.ToolCallID, op.RunID)
	}
	if err != nil {
		return 0, fmt.Errorf("park: journal the call: %w", err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `
		INSERT INTO approvals (public_id, conversation_id, run_id, operation_id, turn_id, outbox_ids, tool, arguments,
			arguments_sha256, definition_sha256, state, expires_at)
		SELECT $1, $2, $3, o.id, $4, $5, o.tool, o.arguments, o.arguments_sha256, coalesce(o.definition_sha256, ''), $6,
			clock_timestamp() + make_interval(secs => $7)
		FROM operations o WHERE o.id = $8
		RETURNING id, expires_at`,
		out.ApprovalID, p.ConversationID, p.RunID, p.TurnID, p.OutboxIDs, p.State, p.TTL.Seconds(), out.OperationID).Scan(&id, &out.ExpiresAt); err != nil {
		return 0, fmt.Errorf("park: record the approval: %w", err)
	}
	return id, nil
}

// Resume is the decided approval a claimed turn resumes from.
type Resume struct {
	ApprovalID string
	// Kind is ApprovalKindCall or ApprovalKindQuestion.
	Kind string
	// Status is approved, denied or expired.
	Status string
	// Question and Answer are a question's (Kind question): what the
	// agent asked, and the person's answer, when they gave one.
	Question *Question
	Answer   json.RawMessage
	// The call's (Kind call).
	OperationID      int64
	ToolCallID       string
	Tool             string
	ArgumentsSHA256  string
	DefinitionSHA256 string
	// IdempotencyKey is the one journaled with the call: an approved
	// call is sent with it.
	IdempotencyKey string
	// State is what the agent stored when it stopped.
	State json.RawMessage
	// OutboxIDs are the rows of the stopped turn: the resumed turn claims
	// exactly these.
	OutboxIDs []int64
	// TurnID is the stopped turn's: the resumed turn is the same turn
	// (its rows at the same generation), and its reply carries the
	// operations of the run that stopped.
	TurnID string
}

// resumeTx reads the approval a conversation names, in a claim's
// transaction that holds the conversation's row lock. A pending approval
// is an *ApprovalWaitError, unless its time is up: then it expires here,
// and the turn resumes with the call denied.
func resumeTx(ctx context.Context, tx Executor, approvalID int64) (*Resume, error) {
	r := &Resume{}
	var expired bool
	var expires time.Time
	var operationID *int64
	var question []byte
	err := tx.QueryRow(ctx, `
		SELECT a.public_id, a.kind, a.status, a.expires_at, a.expires_at <= now(), a.operation_id, coalesce(o.tool_call_id, ''), a.tool,
			a.arguments_sha256, a.definition_sha256, coalesce(o.idempotency_key, ''), a.state, a.outbox_ids, a.turn_id,
			a.question, a.answer
		FROM approvals a LEFT JOIN operations o ON o.id = a.operation_id
		WHERE a.id = $1 FOR UPDATE OF a`, approvalID).Scan(&r.ApprovalID, &r.Kind, &r.Status, &expires, &expired, &operationID,
		&r.ToolCallID, &r.Tool, &r.ArgumentsSHA256, &r.DefinitionSHA256, &r.IdempotencyKey, &r.State, &r.OutboxIDs, &r.TurnID,
		&question, &r.Answer)
	if operationID != nil {
		r.OperationID = *operationID
	}
	if err == nil && question != nil {
		r.Question = &Question{}
		if err = json.Unmarshal(question, r.Question); err != nil {
			err = fmt.Errorf("the question of approval %s is not readable: %w", r.ApprovalID, err)
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim: read approval: %w", err)
	}
	if r.Status != ApprovalPending {
		return r, nil
	}
	if !expired {
		return nil, &ApprovalWaitError{ApprovalID: r.ApprovalID, ExpiresAt: expires}
	}
	if err := expireTx(ctx, tx, approvalID, r.OperationID); err != nil {
		return nil, err
	}
	r.Status = ApprovalExpired
	return r, nil
}

// expireTx denies a call whose approval waited past its time.
func expireTx(ctx context.Context, tx Executor, approvalID, operationID int64) error {
	if _, err := tx.Exec(ctx, `UPDATE approvals SET status = 'expired', decided_at = now() WHERE id = $1`, approvalID); err != nil {
		return fmt.Errorf("expire approval: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE operations SET status = 'denied', error = 'not sent: its approval expired', finished_at = now()
		WHERE id = $1 AND status = 'awaiting_approval'`, operationID); err != nil {
		return fmt.Errorf("expire approval: record the call: %w", err)
	}
	return nil
}

// claimResumeRowsTx marks exactly the stopped turn's rows processing for
// the claiming run. It reports false, and changes nothing, when they are
// not all pending any more or are no longer that turn (a turn cannot
// resume without all of its rows, and rows put back for a regenerated
// reply are a turn of their own, with one more generation): the caller
// then forgets the approval and claims as usual. The caller holds the
// conversation's row lock, which every change of its rows takes, so what
// the check reads is what the update changes.
func claimResumeRowsTx(ctx context.Context, tx Executor, c *Claim, conversationID string, ids []int64, turnID string) (bool, error) {
	var pending, generation, epoch int
	var derived string
	if err := tx.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'pending'), coalesce(max(generation), 0), coalesce(max(epoch), 0),
			baton_turn_id($1, $2, coalesce(max(generation), 0))
		FROM agent_outbox WHERE conversation_id = $1 AND id = ANY($2)`, conversationID, ids).Scan(&pending, &generation, &epoch, &derived); err != nil {
		return false, fmt.Errorf("claim: resume rows: %w", err)
	}
	// The rows are still the stopped turn's, at its generation. A turn
	// that stopped under a Baton that did not salt its ids yet has the
	// unsalted id.
	if pending != len(ids) || (derived != turnID && TurnIDOf(ids, generation) != turnID) {
		return false, nil
	}
	rows, err := tx.Query(ctx, `
		UPDATE agent_outbox SET status = 'processing', attempts = attempts + 1, run_id = $2
		WHERE conversation_id = $1 AND id = ANY($3) AND status = 'pending'
		RETURNING id, attempts, created_at`, conversationID, c.RunID, ids)
	if err != nil {
		return false, fmt.Errorf("claim: resume rows: %w", err)
	}
	for rows.Next() {
		var id int64
		var attempts int
		var created time.Time
		if err := rows.Scan(&id, &attempts, &created); err != nil {
			rows.Close()
			return false, err
		}
		c.OutboxIDs = append(c.OutboxIDs, id)
		c.Attempts = max(c.Attempts, attempts)
		if c.FirstCreatedAt.IsZero() || created.Before(c.FirstCreatedAt) {
			c.FirstCreatedAt = created
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("claim: resume rows: %w", err)
	}
	if len(c.OutboxIDs) != len(ids) {
		return false, fmt.Errorf("claim: resume rows: %d of the %d rows of the stopped turn changed under the conversation's lock", len(c.OutboxIDs), len(ids))
	}
	// The turn that stopped at the approval goes on from its journal.
	c.Generation, c.Epoch, c.Journaled = generation, epoch, true
	if err := tx.QueryRow(ctx, `
		SELECT u.name FROM conversations c JOIN users u ON u.id = c.owner_id WHERE c.id = $1`, conversationID).Scan(&c.Owner); err != nil {
		return false, fmt.Errorf("claim: resume rows: read the owner: %w", err)
	}
	if err := tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM agent_outbox WHERE conversation_id = $1 AND status = 'pending')`, conversationID).Scan(&c.More); err != nil {
		return false, fmt.Errorf("claim: resume rows: %w", err)
	}
	return true, nil
}

// StartApprovedOperationTx starts a call that a person approved, in the
// resumed run, only while that run owns the conversation and only when the
// stored arguments still hash to what was approved. It returns the stored
// arguments: exactly those are sent.
func StartApprovedOperationTx(ctx context.Context, tx Executor, conversationID, runID string, operationID int64, argumentsSHA256 string) (string, error) {
	var owned bool
	err := tx.QueryRow(ctx, `SELECT true FROM conversations WHERE id = $1 AND run_id = $2 FOR SHARE`, conversationID, runID).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ownershipError(ctx, tx, conversationID)
	}
	if err != nil {
		return "", err
	}
	var args string
	err = tx.QueryRow(ctx, fmt.Sprintf(`
		UPDATE operations SET status = 'started', run_id = $2, started_at = now()
		WHERE id = $1 AND status = 'awaiting_approval' AND arguments_sha256 = $3 AND `+argumentsHashSQL+` = $3
		RETURNING arguments::text`, "arguments"), operationID, runID, argumentsSHA256).Scan(&args)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrArgumentsChanged
	}
	if err != nil {
		return "", fmt.Errorf("start approved operation %d: %w", operationID, err)
	}
	return args, nil
}

// DenyOperation records that an approved call was not sent after all
// (its tool changed or went away since the approval).
func DenyOperation(ctx context.Context, db Executor, operationID int64, cause string) error {
	if _, err := db.Exec(ctx, `
		UPDATE operations SET status = 'denied', error = $2, finished_at = now()
		WHERE id = $1 AND status = 'awaiting_approval'`, operationID, cause); err != nil {
		return fmt.Errorf("record a call not sent: %w", err)
	}
	return nil
}

// Approval is an approval as its user sees it.
type Approval struct {
	ID string `json:"id"`
	// Kind is call (a call of Baton's waits to be sent) or question (the
	// agent asked a person).
	Kind string `json:"kind"`
	// Question is the agent's question (kind question).
	Question *Question `json:"question,omitempty"`
	// Answer is the person's answer to a question, once given.
	Answer json.RawMessage `json:"answer,omitempty"`
	Tool   string          `json:"tool"`
	// ToolCallID is the model's id of the call (an AI SDK client's
	// toolCallId).
	ToolCallID      string          `json:"tool_call_id"`
	Arguments       json.RawMessage `json:"arguments"`
	ArgumentsSHA256 string          `json:"arguments_sha256"`
	Status          string          `json:"status"`
	CreatedAt       time.Time       `json:"created_at"`
	ExpiresAt       time.Time       `json:"expires_at"`
	DecidedAt       *time.Time      `json:"decided_at,omitempty"`
	// ConversationKey and OutboxIDs are the server's: for events.
	ConversationKey string  `json:"-"`
	OutboxIDs       []int64 `json:"-"`
	RunID           string  `json:"-"`
	TurnID          string  `json:"-"`
}

const approvalColumns = `a.public_id, a.kind, a.question, a.answer, a.tool,
	coalesce((SELECT o.tool_call_id FROM operations o WHERE o.id = a.operation_id), ''), a.arguments, a.arguments_sha256,
	CASE WHEN a.status = 'pending' AND a.expires_at <= now() THEN 'expired' ELSE a.status END,
	a.created_at, a.expires_at, a.decided_at, a.conversation_id, a.outbox_ids, a.run_id, a.turn_id`

func scanApproval(row pgx.Row) (Approval, error) { return scanApprovalWith(row) }

// ListApprovals returns the approvals of ownerID's conversation, newest
// first, at most limit; ErrNotFound when ownerID has no such conversation.
func ListApprovals(ctx context.Context, db Executor, ownerID int64, conversationID string, limit int) ([]Approval, error) {
	var key string
	err := db.QueryRow(ctx, `SELECT id FROM conversations WHERE owner_id = $1 AND public_id = $2`, ownerID, conversationID).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT `+approvalColumns+` FROM approvals a WHERE a.conversation_id = $1 ORDER BY a.id DESC LIMIT $2`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Approval, error) { return scanApproval(r) })
}

// Decision is a person's answer to an approval.
type Decision struct {
	// Approved is yes or no; for a question, yes with Answer answers it
	// and no declines it.
	Approved bool
	// Answer is the answer to a question, checked against the schema the
	// agent gave (see Question.ResponseSchema).
	Answer json.RawMessage
	// ArgumentsSHA256, when set, is the hash of the arguments the person
	// was shown: the decision holds only for those.
	ArgumentsSHA256 string
	// UserID is who decided.
	UserID int64
}

// DecideApprovalTx records ownerID's decision on an approval of their
// conversation and announces the stopped turn's rows, in the caller's
// transaction, so that a worker resumes the turn. It returns
// ErrNotFound for another user's or a missing conversation or approval,
// ErrApprovalDecided when it was decided already, ErrArgumentsChanged when
// the stored arguments (or the ones the client saw) are not the ones asked
// for. An approval past its time is expired here instead, and returned
// with status expired: the caller commits that too.
func DecideApprovalTx(ctx context.Context, tx Executor, ownerID int64, conversationID, approvalID string, d Decision) (Approval, error) {
	var key string
	err := tx.QueryRow(ctx, `SELECT id FROM conversations WHERE owner_id = $1 AND public_id = $2 FOR NO KEY UPDATE`, ownerID, conversationID).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, ErrNotFound
	}
	if err != nil {
		return Approval{}, fmt.Errorf("decide approval: %w", err)
	}
	var id, operationID int64
	var status string
	var expired, intact bool
	a, err := scanApprovalWith(tx.QueryRow(ctx, `
		SELECT a.id, coalesce(a.operation_id, 0), a.status, a.expires_at <= now(),
			coalesce(`+fmt.Sprintf(argumentsHashSQL, "o.arguments")+` = a.arguments_sha256 AND o.status = 'awaiting_approval', false),
			`+approvalColumns+`
		FROM approvals a LEFT JOIN operations o ON o.id = a.operation_id
		WHERE a.conversation_id = $1 AND a.public_id = $2 FOR UPDATE OF a`, key, approvalID), &id, &operationID, &status, &expired, &intact)
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, ErrNotFound
	}
	if err != nil {
		return Approval{}, fmt.Errorf("decide approval: %w", err)
	}
	if status != ApprovalPending {
		return a, ErrApprovalDecided
	}
	if a.Kind == ApprovalKindQuestion {
		return a, decideQuestionTx(ctx, tx, id, expired, &a, d)
	}
	switch {
	case expired:
		if err := expireTx(ctx, tx, id, operationID); err != nil {
			return a, err
		}
		a.Status = ApprovalExpired
	case !intact || (d.ArgumentsSHA256 != "" && d.ArgumentsSHA256 != a.ArgumentsSHA256):
		return a, ErrArgumentsChanged
	case d.Approved:
		a.Status = ApprovalApproved
	default:
		a.Status = ApprovalDenied
		if _, err := tx.Exec(ctx, `
			UPDATE operations SET status = 'denied', error = 'not sent: the user denied it', finished_at = now()
			WHERE id = $1 AND status = 'awaiting_approval'`, operationID); err != nil {
			return a, fmt.Errorf("decide approval: record the call: %w", err)
		}
	}
	if a.Status != ApprovalExpired {
		if err := tx.QueryRow(ctx, `
			UPDATE approvals SET status = $2, decided_at = now(), decided_by = $3 WHERE id = $1 RETURNING decided_at`,
			id, a.Status, d.UserID).Scan(&a.DecidedAt); err != nil {
			return a, fmt.Errorf("decide approval: %w", err)
		}
	}
	// The rows are labelled as a user's retry (with the time): a decision
	// announced within the duplicate window of the park is not swallowed.
	if err := AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, a.OutboxIDs); err != nil {
		return a, err
	}
	return a, nil
}

// decideQuestionTx records the answer to a question (checked against the
// agent's schema), or that it was declined or expired, and announces the
// turn's rows.
func decideQuestionTx(ctx context.Context, tx Executor, id int64, expired bool, a *Approval, d Decision) error {
	switch {
	case expired:
		if err := expireTx(ctx, tx, id, 0); err != nil {
			return err
		}
		a.Status = ApprovalExpired
	default:
		if err := checkAnswer(a.Question, d); err != nil {
			return err
		}
		a.Status = ApprovalDenied
		if d.Approved {
			a.Status, a.Answer = ApprovalApproved, d.Answer
		}
		if err := tx.QueryRow(ctx, `
			UPDATE approvals SET status = $2, decided_at = now(), decided_by = $3, answer = $4 WHERE id = $1 RETURNING decided_at`,
			id, a.Status, d.UserID, nullJSON(a.Answer)).Scan(&a.DecidedAt); err != nil {
			return fmt.Errorf("decide approval: %w", err)
		}
	}
	return AnnounceTx(ctx, tx, batonnats.ReasonUserRetry, a.OutboxIDs)
}

// nullJSON is nil for an empty JSON value, so that it is stored as NULL.
func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return []byte(b)
}

func scanApprovalWith(row pgx.Row, lead ...any) (Approval, error) {
	var a Approval
	var question []byte
	dest := append(lead, &a.ID, &a.Kind, &question, &a.Answer, &a.Tool, &a.ToolCallID, &a.Arguments, &a.ArgumentsSHA256, &a.Status, &a.CreatedAt, &a.ExpiresAt, &a.DecidedAt,
		&a.ConversationKey, &a.OutboxIDs, &a.RunID, &a.TurnID)
	if err := row.Scan(dest...); err != nil {
		return a, err
	}
	if question != nil {
		a.Question = &Question{}
		if err := json.Unmarshal(question, a.Question); err != nil {
			return a, fmt.Errorf("the question of approval %s is not readable: %w", a.ID, err)
		}
		a.Question.Data = nil
		if a.ToolCallID == "" {
			a.ToolCallID = a.Question.ToolCallID
		}
	}
	return a, nil
}
