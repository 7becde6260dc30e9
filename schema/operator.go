package schema

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The console's operators: who signs in (an operator token, or a JWT the
// console maps to a role), their sessions, and the record of what they do.

// ErrNotOperator: the token is a user's, which the console refuses (403).
var ErrNotOperator = errors.New("the token is a user's, not an operator's")

// ErrSessionEnded: the session signed out, expired, was idle too long, or
// its token was revoked or expired.
var ErrSessionEnded = errors.New("the session ended")

// Operator is who signed in to the console.
type Operator struct {
	// Name is the operator's user name: a token's user, or a JWT's
	// "<iss>|<user claim>".
	Name string
	Role OperatorRole
	// TokenID is the operator token signed in with; zero for a JWT.
	TokenID int64
	// TokenExpiresAt is when that token stops working; zero when it never
	// does.
	TokenExpiresAt time.Time
}

// CanAct reports whether the operator may change anything.
func (o Operator) CanAct() bool { return o.Role == RoleAdmin }

// AuthenticateOperator returns the operator an operator token belongs to.
// An unknown token is ErrNotFound, a revoked one ErrTokenRevoked, an
// expired one ErrTokenExpired, and a user's token ErrNotOperator. It
// records the use (last_used_at, to the minute).
func AuthenticateOperator(ctx context.Context, db Executor, token string) (Operator, error) {
	if !strings.HasPrefix(token, tokenPrefix) {
		return Operator{}, ErrNotFound
	}
	var (
		o                Operator
		role             *string
		revoked, expired bool
		expiresAt        *time.Time
	)
	err := db.QueryRow(ctx, `
		WITH t AS (
			SELECT t.id, u.name, t.operator_role, t.expires_at,
			       t.revoked_at IS NOT NULL AS revoked,
			       coalesce(t.expires_at <= now(), false) AS expired
			FROM api_tokens t JOIN users u ON u.id = t.user_id
			WHERE t.token_hash = $1),
		used AS (
			UPDATE api_tokens SET last_used_at = now()
			WHERE id = (SELECT id FROM t WHERE NOT revoked AND NOT expired AND operator_role IS NOT NULL)
			  AND (last_used_at IS NULL OR last_used_at < now() - $2::interval))
		SELECT id, name, operator_role, expires_at, revoked, expired FROM t`,
		HashToken(token), lastUsedResolution).Scan(&o.TokenID, &o.Name, &role, &expiresAt, &revoked, &expired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Operator{}, ErrNotFound
	case err != nil:
		return Operator{}, fmt.Errorf("authenticate operator: %w", err)
	case revoked:
		return Operator{}, ErrTokenRevoked
	case expired:
		return Operator{}, ErrTokenExpired
	case role == nil:
		return Operator{}, ErrNotOperator
	}
	o.Role = OperatorRole(*role)
	if expiresAt != nil {
		o.TokenExpiresAt = *expiresAt
	}
	return o, nil
}

// ConsoleSession is a signed-in operator's session.
type ConsoleSession struct {
	ID         int64
	Operator   Operator
	CreatedAt  time.Time
	LastSeenAt time.Time
	ExpiresAt  time.Time
}

// StartConsoleSession records a session of op, known by the SHA-256 of
// its secret (the cookie holds the secret), that ends at expiresAt at the
// latest.
func StartConsoleSession(ctx context.Context, db Executor, op Operator, secretHash []byte, expiresAt time.Time) (ConsoleSession, error) {
	s := ConsoleSession{Operator: op, ExpiresAt: expiresAt}
	var tokenID *int64
	if op.TokenID != 0 {
		tokenID = &op.TokenID
	}
	err := db.QueryRow(ctx, `
		INSERT INTO console_sessions (secret_hash, operator, role, token_id, expires_at)
		VALUES ($1, $2, $3, $4, $5)
		RETURNING id, created_at, last_seen_at`, secretHash, op.Name, string(op.Role), tokenID, expiresAt).Scan(&s.ID, &s.CreatedAt, &s.LastSeenAt)
	if err != nil {
		return s, fmt.Errorf("start console session: %w", err)
	}
	return s, nil
}

// ConsoleSessionBySecret returns the live session whose secret has this
// SHA-256, and records that it was seen (to within a tenth of idle, a
// minute at most). A session that signed out, expired, was idle for
// longer than idle, or whose token was revoked or expired is
// ErrSessionEnded; an unknown one ErrNotFound.
func ConsoleSessionBySecret(ctx context.Context, db Executor, secretHash []byte, idle time.Duration) (ConsoleSession, error) {
	resolution := min(idle/10, time.Minute)
	var s ConsoleSession
	var role string
	var tokenID *int64
	var tokenExpires *time.Time
	var live bool
	err := db.QueryRow(ctx, `
		WITH s AS (
			SELECT s.id, s.operator, s.role, s.token_id, s.created_at, s.last_seen_at, s.expires_at, t.expires_at AS token_expires_at,
			       s.ended_at IS NULL AND s.expires_at > now() AND s.last_seen_at > now() - $2::interval
			       AND (s.token_id IS NULL OR (t.revoked_at IS NULL AND coalesce(t.expires_at > now(), true))) AS live
			FROM console_sessions s LEFT JOIN api_tokens t ON t.id = s.token_id
			WHERE s.secret_hash = $1),
		seen AS (
			UPDATE console_sessions SET last_seen_at = now()
			WHERE id = (SELECT id FROM s WHERE live) AND last_seen_at < now() - $3::interval)
		SELECT id, operator, role, token_id, created_at, last_seen_at, expires_at, token_expires_at, live FROM s`,
		secretHash, idle, resolution).Scan(&s.ID, &s.Operator.Name, &role, &tokenID, &s.CreatedAt, &s.LastSeenAt, &s.ExpiresAt, &tokenExpires, &live)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, ErrNotFound
	case err != nil:
		return s, fmt.Errorf("read console session: %w", err)
	case !live:
		return s, ErrSessionEnded
	}
	s.Operator.Role = OperatorRole(role)
	if tokenID != nil {
		s.Operator.TokenID = *tokenID
	}
	if tokenExpires != nil {
		s.Operator.TokenExpiresAt = *tokenExpires
	}
	return s, nil
}

// EndConsoleSession signs a session out.
func EndConsoleSession(ctx context.Context, db Executor, id int64) error {
	if _, err := db.Exec(ctx, `UPDATE console_sessions SET ended_at = now() WHERE id = $1 AND ended_at IS NULL`, id); err != nil {
		return fmt.Errorf("end console session: %w", err)
	}
	return nil
}

// PruneConsoleSessions deletes up to limit sessions that can no longer be
// used: signed out, expired, or idle for longer than idle. It returns how
// many it deleted.
func PruneConsoleSessions(ctx context.Context, db Executor, idle time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, `
		DELETE FROM console_sessions WHERE id IN (
			SELECT id FROM console_sessions
			WHERE ended_at IS NOT NULL OR expires_at <= now() OR last_seen_at <= now() - $1::interval
			LIMIT $2)`, idle, limit)
	if err != nil {
		return 0, fmt.Errorf("prune console sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Operator actions, as recorded in operator_actions.
const (
	ActionSignIn            = "sign_in"
	ActionSignOut           = "sign_out"
	ActionViewConversation  = "view_conversation"
	ActionRetryTurn         = "retry_turn"
	ActionResumeTurn        = "resume_turn"
	ActionRecordOutcome     = "record_outcome"
	ActionDiscardDeadLetter = "discard_dead_letter"
	ActionRetryDeadLetter   = "retry_dead_letter"
)

// OperatorAction is one row of operator_actions: who did what, when.
type OperatorAction struct {
	ID       int64
	At       time.Time
	Operator string
	Role     OperatorRole
	Action   string
	// Target is what it was done to: a conversation's key, an operation,
	// a group's dead letter.
	Target string
	Detail string
}

// RecordOperatorActionTx records what op did, in the transaction that did
// it: the record and the action commit together.
func RecordOperatorActionTx(ctx context.Context, tx Executor, op Operator, action, target, detail string) error {
	if _, err := tx.Exec(ctx, `
		INSERT INTO operator_actions (operator, role, action, target, detail) VALUES ($1, $2, $3, $4, $5)`,
		op.Name, string(op.Role), action, target, detail); err != nil {
		return fmt.Errorf("record operator action %s: %w", action, err)
	}
	return nil
}

// OperatorActions lists the recorded actions, newest first: up to limit
// of those with an id below before (0: from the newest).
func OperatorActions(ctx context.Context, db Executor, before int64, limit int) ([]OperatorAction, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	rows, err := db.Query(ctx, `
		SELECT id, at, operator, role, action, target, detail FROM operator_actions
		WHERE id < $1 ORDER BY id DESC LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("list operator actions: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OperatorAction, error) {
		var a OperatorAction
		var role string
		err := row.Scan(&a.ID, &a.At, &a.Operator, &role, &a.Action, &a.Target, &a.Detail)
		a.Role = OperatorRole(role)
		return a, err
	})
}
