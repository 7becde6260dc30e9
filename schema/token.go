package schema

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// tokenPrefix makes Baton tokens recognisable in logs and secret scanners.
const tokenPrefix = "baton_"

// User owns conversations.
type User struct {
	ID   int64
	Name string
}

// HashToken is how tokens are stored: SHA-256 of the whole token. Tokens
// are 256 random bits, so a fast hash is enough (no password stretching
// needed) and lookups stay a single index probe.
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// CreateToken creates the user when missing and a new token for them. The
// token is returned once and only its hash is stored.
func CreateToken(ctx context.Context, db Executor, userName string) (string, User, error) {
	userName = strings.TrimSpace(userName)
	if userName == "" || len(userName) > 200 {
		return "", User{}, errors.New("user name must be 1 to 200 characters")
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
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", User{}, err
	}
	token := tokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	if _, err := db.Exec(ctx, `INSERT INTO api_tokens (user_id, token_hash) VALUES ($1, $2)`, u.ID, HashToken(token)); err != nil {
		return "", User{}, fmt.Errorf("store token: %w", err)
	}
	return token, u, nil
}

// Authenticate returns the user a token belongs to, or ErrNotFound.
func Authenticate(ctx context.Context, db Executor, token string) (User, error) {
	if !strings.HasPrefix(token, tokenPrefix) {
		return User{}, ErrNotFound
	}
	var u User
	err := db.QueryRow(ctx, `
		SELECT u.id, u.name FROM api_tokens t JOIN users u ON u.id = t.user_id
		WHERE t.token_hash = $1 AND t.revoked_at IS NULL`, HashToken(token)).Scan(&u.ID, &u.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return User{}, ErrNotFound
	}
	return u, err
}
