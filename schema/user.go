package schema

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxUserNameLength bounds a user's name, in characters (users.name). A
// user who signs in with a JWT is named "<iss>|<user claim>", which fits.
const MaxUserNameLength = 512

// EnsureUser returns the user named name, made when missing (an upsert on
// the name). The API calls it for each request with a verified JWT, so
// the user of a valid token exists from their first request on and every
// quota of a user applies to them. A user who exists costs one index
// probe and writes nothing.
func EnsureUser(ctx context.Context, db Executor, name string) (User, error) {
	if name == "" || utf8.RuneCountInString(name) > MaxUserNameLength {
		return User{}, fmt.Errorf("user name must be 1 to %d characters", MaxUserNameLength)
	}
	var u User
	// Two first requests at once: one inserts, and the other's insert
	// does nothing while its snapshot cannot see the row yet; it reads
	// again.
	for attempt := 0; attempt < 3; attempt++ {
		err := db.QueryRow(ctx, `
			WITH found AS (SELECT id, name FROM users WHERE name = $1),
			ins AS (
				INSERT INTO users (name) SELECT $1 WHERE NOT EXISTS (SELECT FROM found)
				ON CONFLICT (name) DO NOTHING
				RETURNING id, name)
			SELECT id, name FROM found
			UNION ALL
			SELECT id, name FROM ins`, name).Scan(&u.ID, &u.Name)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return User{}, fmt.Errorf("ensure user: %w", err)
		}
		return u, nil
	}
	return User{}, fmt.Errorf("ensure user: the user %q was made and not seen", name)
}
