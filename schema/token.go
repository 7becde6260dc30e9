package schema

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// tokenPrefix makes Baton tokens recognisable in logs and secret scanners.
const tokenPrefix = "baton_"

// publicIDLength is the length of a token's public id, the part of the
// token text that names it in listings.
const publicIDLength = 8

// lastUsedResolution is how stale a token's last_used_at may get: a token
// used all the time costs one write a minute, not one per request.
const lastUsedResolution = time.Minute

// Errors of a token that exists but no longer lets anyone in. They wrap
// nothing: the API turns them into 401 with a message that says what to do.
var (
	ErrTokenRevoked = errors.New("the token was revoked")
	ErrTokenExpired = errors.New("the token expired")
	// ErrOperatorToken: an operator's token, which signs in to the
	// console and nowhere else.
	ErrOperatorToken = errors.New("the token is an operator's: it signs in to the console only")
)

// OperatorRole is what an operator may do in the console.
type OperatorRole string

const (
	// RoleAdmin reads and acts: retries, recorded outcomes, dead letters.
	RoleAdmin OperatorRole = "admin"
	// RoleViewer reads only.
	RoleViewer OperatorRole = "viewer"
)

// Valid reports whether r is one of the roles.
func (r OperatorRole) Valid() bool { return r == RoleAdmin || r == RoleViewer }

// User owns conversations. Authenticate also fills in the token the
// request came with, so that a long-lived request (an event stream) can
// check it again (TokenActive) and end when it expires.
type User struct {
	ID   int64
	Name string
	// TokenID is the id of the token (api_tokens.id) that authenticated
	// the user; zero when the User did not come from a token.
	TokenID int64
	// TokenExpiresAt is when that token stops working; zero when it never
	// expires.
	TokenExpiresAt time.Time
}

// Token is one API token as an operator sees it: never the token text or
// its hash.
type Token struct {
	ID int64
	// PublicID names the token in listings; the token text starts with
	// "baton_<PublicID>_". Empty for tokens created before public ids.
	PublicID   string
	UserName   string
	CreatedAt  time.Time
	ExpiresAt  *time.Time
	RevokedAt  *time.Time
	LastUsedAt *time.Time
	// OperatorRole is the console role of an operator token; empty for a
	// user's token.
	OperatorRole OperatorRole
}

// State is "active", "revoked" or "expired" at now.
func (t Token) State(now time.Time) string {
	switch {
	case t.RevokedAt != nil:
		return "revoked"
	case t.ExpiresAt != nil && !t.ExpiresAt.After(now):
		return "expired"
	}
	return "active"
}

// HashToken is how tokens are stored: SHA-256 of the whole token. Tokens
// are 256 random bits, so a fast hash is enough (no password stretching
// needed) and lookups stay a single index probe.
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// CreateToken creates the user when missing and a new token for them that
// never expires. The token is returned once and only its hash is stored.
func CreateToken(ctx context.Context, db Executor, userName string) (string, User, error) {
	return CreateTokenUntil(ctx, db, userName, time.Time{})
}

// CreateTokenUntil is CreateToken for a token that stops working at
// expiresAt; a zero expiresAt never expires. The returned User carries
// the new token's id and expiry.
func CreateTokenUntil(ctx context.Context, db Executor, userName string, expiresAt time.Time) (string, User, error) {
	return createToken(ctx, db, userName, expiresAt, "")
}

// CreateOperatorToken is CreateTokenUntil for an operator of the console
// with the given role. The token signs in to the console only: the API
// refuses it (ErrOperatorToken), so an operator's token never reads or
// writes as a user.
func CreateOperatorToken(ctx context.Context, db Executor, userName string, role OperatorRole, expiresAt time.Time) (string, User, error) {
	if !role.Valid() {
		return "", User{}, fmt.Errorf("operator role %q: give %q or %q", role, RoleAdmin, RoleViewer)
	}
	return createToken(ctx, db, userName, expiresAt, role)
}

func createToken(ctx context.Context, db Executor, userName string, expiresAt time.Time, role OperatorRole) (string, User, error) {
	userName = strings.TrimSpace(userName)
	if userName == "" || utf8.RuneCountInString(userName) > MaxUserNameLength {
		return "", User{}, fmt.Errorf("user name must be 1 to %d characters", MaxUserNameLength)
	}
	var expires *time.Time
	if !expiresAt.IsZero() {
		if !expiresAt.After(time.Now()) {
			return "", User{}, fmt.Errorf("the expiry %s is not in the future", expiresAt.UTC().Format(time.RFC3339))
		}
		expires = &expiresAt
	}
	var u User
	err := db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO users (name) VALUES ($1)
			ON CONFLICT (name) DO NOTHING
			RETURNING id, name)
		SELECT id, name FROM ins
		UNION ALL
		SELECT id, name FROM users WHERE name = $1
		LIMIT 1`, userName).Scan(&u.ID, &u.Name)
	if err != nil {
		return "", User{}, fmt.Errorf("create user %q: %w", userName, err)
	}
	// A public id is 47 random bits: a clash is rare, and another draw
	// settles it.
	for attempt := 0; ; attempt++ {
		publicID, err := randomAlphanumeric(publicIDLength)
		if err != nil {
			return "", User{}, err
		}
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return "", User{}, err
		}
		token := tokenPrefix + publicID + "_" + base64.RawURLEncoding.EncodeToString(raw)
		err = db.QueryRow(ctx, `
			INSERT INTO api_tokens (user_id, token_hash, public_id, expires_at, operator_role) VALUES ($1, $2, $3, $4, nullif($5, ''))
			RETURNING id`, u.ID, HashToken(token), publicID, expires, string(role)).Scan(&u.TokenID)
		if IsUniqueViolation(err) && attempt < 3 {
			continue
		}
		if err != nil {
			return "", User{}, fmt.Errorf("store token: %w", err)
		}
		if expires != nil {
			u.TokenExpiresAt = *expires
		}
		return token, u, nil
	}
}

// randomAlphanumeric returns n characters from [A-Za-z0-9], uniformly.
func randomAlphanumeric(n int) (string, error) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	out := make([]byte, 0, n)
	buf := make([]byte, 2*n)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for _, b := range buf {
			// 248 = 4*62: rejecting the rest keeps every character equally
			// likely.
			if b < 248 && len(out) < n {
				out = append(out, alphabet[b%62])
			}
		}
	}
	return string(out), nil
}

// Authenticate returns the user a token belongs to, with the token's id
// and expiry. An unknown token is ErrNotFound; a revoked one
// ErrTokenRevoked; an expired one ErrTokenExpired; an operator's token
// ErrOperatorToken. It records the use (last_used_at, to the minute).
func Authenticate(ctx context.Context, db Executor, token string) (User, error) {
	if !strings.HasPrefix(token, tokenPrefix) {
		return User{}, ErrNotFound
	}
	var (
		u                          User
		revoked, expired, operator bool
		expiresAt                  *time.Time
	)
	err := db.QueryRow(ctx, `
		WITH t AS (
			SELECT t.id, t.user_id, u.name, t.expires_at,
			       t.revoked_at IS NOT NULL AS revoked,
			       coalesce(t.expires_at <= now(), false) AS expired,
			       t.operator_role IS NOT NULL AS operator
			FROM api_tokens t JOIN users u ON u.id = t.user_id
			WHERE t.token_hash = $1),
		used AS (
			UPDATE api_tokens SET last_used_at = now()
			WHERE id = (SELECT id FROM t WHERE NOT revoked AND NOT expired AND NOT operator)
			  AND (last_used_at IS NULL OR last_used_at < now() - $2::interval))
		SELECT id, user_id, name, expires_at, revoked, expired, operator FROM t`,
		HashToken(token), lastUsedResolution).Scan(&u.TokenID, &u.ID, &u.Name, &expiresAt, &revoked, &expired, &operator)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return User{}, ErrNotFound
	case err != nil:
		return User{}, err
	case operator:
		return User{}, ErrOperatorToken
	case revoked:
		return User{}, ErrTokenRevoked
	case expired:
		return User{}, ErrTokenExpired
	}
	if expiresAt != nil {
		u.TokenExpiresAt = *expiresAt
	}
	return u, nil
}

// TokenActive reports whether the token with this id still lets its user
// in: it exists, is not revoked and has not expired. A long-lived request
// checks it again while it runs.
func TokenActive(ctx context.Context, db Executor, tokenID int64) (bool, error) {
	var active bool
	err := db.QueryRow(ctx, `
		SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()) AND operator_role IS NULL
		FROM api_tokens WHERE id = $1`, tokenID).Scan(&active)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return active, err
}

// ListTokens returns a user's tokens, oldest first; ErrNotFound when there
// is no such user.
func ListTokens(ctx context.Context, db Executor, userName string) ([]Token, error) {
	var userID int64
	err := db.QueryRow(ctx, `SELECT id FROM users WHERE name = $1`, strings.TrimSpace(userName)).Scan(&userID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT t.id, coalesce(t.public_id, ''), u.name, t.created_at, t.expires_at, t.revoked_at, t.last_used_at, coalesce(t.operator_role, '')
		FROM api_tokens t JOIN users u ON u.id = t.user_id
		WHERE t.user_id = $1 ORDER BY t.created_at, t.id`, userID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanToken)
}

func scanToken(row pgx.CollectableRow) (Token, error) {
	var t Token
	var role string
	err := row.Scan(&t.ID, &t.PublicID, &t.UserName, &t.CreatedAt, &t.ExpiresAt, &t.RevokedAt, &t.LastUsedAt, &role)
	t.OperatorRole = OperatorRole(role)
	return t, err
}

// RevokeToken revokes the token with this id at once: every request with
// it gets 401 from then on. Revoking a revoked token changes nothing and
// returns it as it is; an unknown id is ErrNotFound.
func RevokeToken(ctx context.Context, db Executor, tokenID int64) (Token, error) {
	rows, err := db.Query(ctx, `
		WITH rev AS (
			UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
			WHERE id = $1
			RETURNING id, public_id, user_id, created_at, expires_at, revoked_at, last_used_at, operator_role)
		SELECT rev.id, coalesce(rev.public_id, ''), u.name, rev.created_at, rev.expires_at, rev.revoked_at, rev.last_used_at, coalesce(rev.operator_role, '')
		FROM rev JOIN users u ON u.id = rev.user_id`, tokenID)
	if err != nil {
		return Token{}, err
	}
	t, err := pgx.CollectExactlyOneRow(rows, scanToken)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	return t, err
}
